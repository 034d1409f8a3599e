package tracing

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/schemas"
)

// propagator is W3C trace context: the traceparent (and tracestate) headers.
var propagator = propagation.TraceContext{}

// HeaderCarrier carries trace context in NATS message headers. NATS header
// names are case-sensitive; W3C's are lower case (schemas.HdrTrace).
type HeaderCarrier nats.Header

// Get implements propagation.TextMapCarrier.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys implements propagation.TextMapCarrier.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Extract returns ctx with the remote span context of h's traceparent (and
// tracestate), or ctx as it is if h has none or a malformed one.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(h))
}

// Inject writes the span context of ctx into h as traceparent (and
// tracestate), replacing what was there. With no valid span context in ctx
// it leaves h alone: with tracing off, an incoming traceparent passes through.
func Inject(ctx context.Context, h nats.Header) {
	if h == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	delete(h, "tracestate")
	propagator.Inject(ctx, HeaderCarrier(h))
}

// InjectSpan is Inject with the span context of span.
func InjectSpan(span trace.Span, h nats.Header) {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return
	}
	Inject(trace.ContextWithSpanContext(context.Background(), sc), h)
}

// FromTraceparent returns ctx with the remote span context of a W3C
// traceparent (and tracestate) value, e.g. from an HTTP request; ctx as it is
// if traceparent is empty or malformed.
func FromTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return propagator.Extract(ctx, c)
}

// Traceparent formats the span context of span as a W3C traceparent value,
// or "" if it has none (tracing off).
func Traceparent(span trace.Span) string {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return ""
	}
	// version-traceid-spanid-flags, as propagation.TraceContext writes it.
	flags := "00"
	if sc.IsSampled() {
		flags = "01"
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + flags
}

// StartFromHeader starts a span whose parent is the trace context in h (a new
// trace if none). With tracing off it costs what Start does: nothing.
func (t Tracer) StartFromHeader(ctx context.Context, h nats.Header, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if !Enabled() {
		return ctx, noopSpan
	}
	return t.Start(Extract(ctx, h), name, kind)
}

// Operation is the gen_ai.operation.name of a request kind (the GenAI
// conventions' names; tokenize and detokenize have none there and keep theirs).
func Operation(k schemas.Kind) string {
	switch k {
	case schemas.KindCompletion:
		return "text_completion"
	case schemas.KindEmbedding:
		return "embeddings"
	case schemas.KindTokenize, schemas.KindDetokenize:
		return string(k)
	}
	return "chat"
}

// HeaderTraceID is the trace id in h's traceparent, for a log line about a
// request that has no span (yet); "" with tracing off or no valid traceparent.
func HeaderTraceID(h nats.Header) string {
	if !Enabled() || h == nil {
		return ""
	}
	sc := trace.SpanContextFromContext(Extract(context.Background(), h))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
