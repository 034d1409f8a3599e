package tracing

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tokenbus/tokenbus/schemas"
)

// state is one installed provider and its tracers by scope.
type state struct {
	tp      trace.TracerProvider
	tracers sync.Map // scope name -> trace.Tracer
}

var (
	current   atomic.Pointer[state]
	installMu sync.Mutex
)

// Enabled reports whether a tracer provider is installed.
func Enabled() bool { return current.Load() != nil }

// Install makes tp the provider of every span the components start, until
// uninstall, which puts back what was installed before.
func Install(tp trace.TracerProvider) (uninstall func()) {
	installMu.Lock()
	defer installMu.Unlock()
	st := &state{tp: tp}
	prev := current.Swap(st)
	var once sync.Once
	return func() {
		once.Do(func() {
			installMu.Lock()
			defer installMu.Unlock()
			current.CompareAndSwap(st, prev)
		})
	}
}

// Propagator is the W3C trace-context propagator (traceparent, tracestate).
func Propagator() propagation.TextMapPropagator { return propagator }

// Tracer starts spans of one instrumentation scope (a package path).
type Tracer struct{ scope string }

// NewTracer is the Tracer of scope; it is cheap and can be a package variable.
func NewTracer(scope string) Tracer { return Tracer{scope: scope} }

var noopSpan trace.Span = noop.Span{}

// Start starts a span named name of kind under ctx. With tracing off it
// returns ctx and a no-op span at once. Name the span with its static part
// and, behind span.IsRecording(), set the rest (SetName, SetAttributes).
func (t Tracer) Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	st := current.Load()
	if st == nil {
		return ctx, noopSpan
	}
	return st.tracer(t.scope).Start(ctx, name, trace.WithSpanKind(kind))
}

// StartAt is Start with an explicit start time.
func (t Tracer) StartAt(ctx context.Context, name string, kind trace.SpanKind, at time.Time) (context.Context, trace.Span) {
	st := current.Load()
	if st == nil {
		return ctx, noopSpan
	}
	return st.tracer(t.scope).Start(ctx, name, trace.WithSpanKind(kind), trace.WithTimestamp(at))
}

func (st *state) tracer(scope string) trace.Tracer {
	if tr, ok := st.tracers.Load(scope); ok {
		return tr.(trace.Tracer)
	}
	tr, _ := st.tracers.LoadOrStore(scope, st.tp.Tracer(scope))
	return tr.(trace.Tracer)
}

// Fail marks span failed: status Error with err's message, and error.type
// (the tokenbus error code, or the OpenAI error type).
func Fail(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	span.SetStatus(codes.Error, Annotate(span, err))
}

// Annotate sets err's error.type (and the HTTP status of a tokenbus error) on
// span without marking it failed, for an answer that is the client's fault
// (a 4xx); it returns the error's message.
func Annotate(span trace.Span, err error) string {
	if err == nil || !span.IsRecording() {
		return ""
	}
	typ, msg := "error", err.Error()
	var e *schemas.Error
	if errors.As(err, &e) {
		typ, msg = e.Body.Type, e.Body.Message
		if e.Body.Code != nil && *e.Body.Code != "" {
			typ = *e.Body.Code
		}
		span.SetAttributes(attribute.Int(AttrErrorStatus, e.Status))
	}
	span.SetAttributes(attribute.String("error.type", typ))
	return msg
}

// TraceID is the trace id of span as hex, or "" (tracing off, no trace).
func TraceID(span trace.Span) string {
	sc := span.SpanContext()
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
