package gateway

import (
	"context"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

var tracer = tracing.NewTracer("github.com/tokenbus/tokenbus/gateway")

// localSpan is the fiber.Ctx local holding a completion request's server span
// (trace.Span), set only with tracing on: observe ends it, or the stream
// writer for a stream.
const localSpan = "tb.span"

// startSpan starts the server span of a completion request, the child of the
// client's traceparent if it sent one. With tracing off it is a no-op span.
func startSpan(c *fiber.Ctx, kind schemas.Kind, id string, start time.Time) trace.Span {
	if !tracing.Enabled() {
		return noop.Span{}
	}
	// Clones: fasthttp reuses its buffers once the handler returned, and a
	// parsed tracestate keeps pieces of its input.
	ctx := tracing.FromTraceparent(context.Background(), c.Get("traceparent"), strings.Clone(c.Get("tracestate")))
	_, span := tracer.StartAt(ctx, fiber.MethodPost, trace.SpanKindServer, start)
	if span.IsRecording() {
		route := c.Route().Path
		span.SetName(fiber.MethodPost + " " + route)
		span.SetAttributes(
			attribute.String(tracing.AttrHTTPMethod, fiber.MethodPost),
			attribute.String(tracing.AttrHTTPRoute, route),
			attribute.String(tracing.AttrRequestID, id),
			attribute.String(tracing.AttrOperation, tracing.Operation(kind)),
		)
	}
	c.Locals(localSpan, span)
	return span
}

// outgoingTrace is the traceparent a request carries on the bus: the server
// span's, or with tracing off the client's own if well formed.
func outgoingTrace(span trace.Span, incoming string) string {
	if tp := tracing.Traceparent(span); tp != "" {
		return tp
	}
	return traceParent(incoming)
}

// endSpan ends a request's server span with its HTTP status and outcome; a
// 5xx is an error (OpenTelemetry's HTTP server convention), a 4xx gets
// error.type, a client that went away neither (it is no failure of ours).
func endSpan(span trace.Span, status int, err error, outcome string) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int(tracing.AttrHTTPStatus, status))
		if outcome != "" {
			span.SetAttributes(attribute.String(tracing.AttrOutcome, outcome))
		}
		switch {
		case outcome == "client_gone":
		case status >= 500 && err != nil:
			tracing.Fail(span, err)
		case status >= 500:
			span.SetStatus(codes.Error, outcome)
		case status >= 400 && err != nil:
			tracing.Annotate(span, err)
		}
	}
	span.End()
}
