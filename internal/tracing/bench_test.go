package tracing

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/schemas"
)

// hop is what a component does for tracing on one request, as the
// dispatcher and the worker do it: a span from the header's trace context,
// named and given attributes only if it records, its context written back
// into the header, an event, the end.
func hop(tr Tracer, h nats.Header, model string) {
	_, span := tr.StartFromHeader(context.Background(), h, "dispatch", trace.SpanKindConsumer)
	if span.IsRecording() {
		span.SetName("dispatch " + model)
		span.SetAttributes(attribute.String(AttrModel, model), attribute.String(AttrRequestID, "req-1"),
			attribute.String(AttrMsgSystem, "nats"))
	}
	InjectSpan(span, h)
	span.AddEvent(EventFirstToken)
	span.End()
}

// baseline is no tracing code at all.
//
//go:noinline
func baseline(h nats.Header) {}

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkHop: one hop's tracing work per request. "off" against
// "baseline" is what tracing costs when no endpoint is set; "on" is with the
// SDK (batching to an exporter that drops everything), sampled and not.
func BenchmarkHop(b *testing.B) {
	tr := NewTracer("bench")
	header := func() nats.Header {
		return nats.Header{schemas.HdrRequestID: {"req-1"}, schemas.HdrTrace: {inParent}}
	}
	b.Run("baseline", func(b *testing.B) {
		h := header()
		b.ReportAllocs()
		for b.Loop() {
			baseline(h)
		}
	})
	b.Run("off", func(b *testing.B) {
		h := header()
		b.ReportAllocs()
		for b.Loop() {
			hop(tr, h, "llama-8b")
		}
	})
	for _, tc := range []struct {
		name   string
		parent string
	}{
		{"on-sampled", inParent},
		{"on-unsampled", "00-" + inTrace + "-" + inSpan + "-00"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}),
				sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
			current.Store(&state{tp: tp})
			defer func() { current.Store(nil); _ = tp.Shutdown(context.Background()) }()
			h, parent := header(), []string{tc.parent}
			b.ReportAllocs()
			for b.Loop() {
				h[schemas.HdrTrace] = parent // each request arrives from the same parent
				hop(tr, h, "llama-8b")
			}
		})
	}
}
