package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokenbus/tokenbus/internal/tracing"
)

// SpanLog records, in memory, the spans the components end while a test
// runs: tracing on without an exporter.
type SpanLog struct {
	rec *tracetest.SpanRecorder
}

// RecordSpans turns tracing on for the test (every new trace sampled) and
// records the spans; tracing is off again after the test.
func RecordSpans(t testing.TB) *SpanLog {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	uninstall := tracing.Install(tp)
	t.Cleanup(func() { uninstall(); _ = tp.Shutdown(context.Background()) })
	return &SpanLog{rec: rec}
}

// Spans are the spans ended so far.
func (l *SpanLog) Spans() []Span {
	var out []Span
	for _, s := range l.rec.Ended() {
		sp := Span{
			TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
			Name: s.Name(), Kind: s.SpanKind().String(), Scope: s.InstrumentationScope().Name,
			Attrs:       kvs(s.Attributes()),
			StatusError: s.Status().Code == codes.Error, StatusMessage: s.Status().Description,
		}
		if s.Parent().IsValid() {
			sp.ParentSpanID = s.Parent().SpanID().String()
		}
		if r := s.Resource(); r != nil {
			if v, ok := r.Set().Value("service.name"); ok {
				sp.Service = v.AsString()
			}
		}
		for _, e := range s.Events() {
			sp.Events = append(sp.Events, e.Name)
		}
		out = append(out, sp)
	}
	return out
}

// Trace are the spans ended so far of one trace (hex id).
func (l *SpanLog) Trace(traceID string) []Span {
	var out []Span
	for _, s := range l.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

func kvs(attrs []attribute.KeyValue) map[string]string {
	m := make(map[string]string, len(attrs))
	for _, kv := range attrs {
		switch kv.Value.Type() {
		case attribute.STRING:
			m[string(kv.Key)] = kv.Value.AsString()
		default:
			m[string(kv.Key)] = strings.Trim(fmt.Sprint(kv.Value.AsInterface()), "[]")
		}
	}
	return m
}
