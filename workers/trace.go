package workers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

var tracer = tracing.NewTracer("github.com/tokenbus/tokenbus/workers")

// startSpan starts c's consumer span "generate <model>", the child of the
// trace context in m's header (the dispatcher's span), and makes it what the
// engine passes on (engine.Request.TraceParent; the returned context holds
// the span for engines that start their own). With tracing off the header's
// traceparent passes through as it is.
func (w *Worker) startSpan(c *call, m *nats.Msg) context.Context {
	ctx, span := tracer.StartFromHeader(context.Background(), m.Header, "generate", trace.SpanKindConsumer)
	c.span = span
	if span.IsRecording() {
		span.SetName("generate " + c.req.Model)
		span.SetAttributes(
			attribute.String(tracing.AttrMsgSystem, "nats"),
			attribute.String(tracing.AttrMsgDest, m.Subject),
			attribute.String(tracing.AttrMsgOperation, "process"),
			attribute.String(tracing.AttrRequestID, c.req.ID),
			attribute.String(tracing.AttrModel, c.req.Model),
			attribute.String(tracing.AttrOperation, tracing.Operation(c.req.Kind)),
			attribute.String(tracing.AttrWorker, w.cfg.ID),
		)
	}
	if tp := tracing.Traceparent(span); tp != "" {
		c.req.TraceParent = tp
	}
	return ctx
}

// record notes how c ended, on its span (ended by finish) and in the log:
// a line per request at Debug, at Warn for a server-side failure.
func (c *call) record(outcome string, err error, usage *schemas.Usage) {
	span := c.span
	if span.IsRecording() {
		span.SetAttributes(attribute.String(tracing.AttrOutcome, outcome))
		if usage != nil {
			span.SetAttributes(attribute.Int(tracing.AttrInputTokens, usage.PromptTokens),
				attribute.Int(tracing.AttrOutputTokens, usage.CompletionTokens))
		}
		tracing.Fail(span, err)
	}
	level := slog.LevelDebug
	var e *schemas.Error
	if errors.As(err, &e) && e.Status >= 500 {
		level = slog.LevelWarn
	}
	log := c.w.log
	if !log.Enabled(context.Background(), level) {
		return
	}
	attrs := []slog.Attr{slog.String("request_id", c.req.ID), slog.String("model", c.req.Model),
		slog.String("outcome", outcome), slog.Duration("duration", time.Since(c.start))}
	if tid := tracing.TraceID(span); tid != "" {
		attrs = append(attrs, slog.String("trace_id", tid))
	}
	if usage != nil {
		attrs = append(attrs, slog.Int("prompt_tokens", usage.PromptTokens), slog.Int("completion_tokens", usage.CompletionTokens))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	log.LogAttrs(context.Background(), level, "request", attrs...)
}
