package httpengine

import (
	"context"
	"errors"
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/workers/engine"
)

var tracer = tracing.NewTracer("github.com/tokenbus/tokenbus/workers/engine/httpengine")

// startSpan starts the client span of one request to the server, "POST
// <path>", the child of the worker's span in ctx. Its context is the
// traceparent the server gets.
func (e *Engine) startSpan(ctx context.Context, req *engine.Request, path string) trace.Span {
	_, span := tracer.Start(ctx, "POST", trace.SpanKindClient)
	if span.IsRecording() {
		span.SetName("POST " + path)
		attrs := []attribute.KeyValue{
			attribute.String(tracing.AttrHTTPMethod, "POST"),
			attribute.String(tracing.AttrURLFull, e.base+path),
			attribute.String(tracing.AttrRequestID, req.ID),
			attribute.String(tracing.AttrModel, req.Model),
			attribute.String(tracing.AttrOperation, tracing.Operation(req.Kind)),
			attribute.String("gen_ai.provider.name", e.name),
		}
		if u, err := url.Parse(e.base); err == nil {
			attrs = append(attrs, attribute.String(tracing.AttrServerAddr, u.Hostname()))
			if p, err := strconv.Atoi(u.Port()); err == nil {
				attrs = append(attrs, attribute.Int(tracing.AttrServerPort, p))
			}
		}
		span.SetAttributes(attrs...)
	}
	return span
}

// traceparent is what the server gets: the client span's context, or with
// tracing off the request's own traceparent.
func traceparent(span trace.Span, req *engine.Request) string {
	if tp := tracing.Traceparent(span); tp != "" {
		return tp
	}
	return req.TraceParent
}

// endSpan ends the client span: an error unless the caller cancelled.
func endSpan(span trace.Span, res *engine.Result, err error) {
	if span.IsRecording() {
		switch {
		case err == nil && res != nil && res.UsageEstimated:
			// A stream without a usage chunk: the count is ours, one
			// token per chunk; the prompt's is unknown.
			span.SetAttributes(attribute.Int(tracing.AttrOutputTokens, res.Usage.CompletionTokens),
				attribute.Bool(tracing.AttrUsageEstimated, true))
		case err == nil:
			if res != nil {
				span.SetAttributes(attribute.Int(tracing.AttrInputTokens, res.Usage.PromptTokens),
					attribute.Int(tracing.AttrOutputTokens, res.Usage.CompletionTokens))
			}
		case errors.Is(err, context.Canceled):
			span.SetAttributes(attribute.String(tracing.AttrOutcome, "cancelled"))
		default:
			tracing.Fail(span, err)
		}
	}
	span.End()
}

// statusOnSpan records the server's HTTP status.
func statusOnSpan(span trace.Span, status int) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int(tracing.AttrHTTPStatus, status))
	}
}
