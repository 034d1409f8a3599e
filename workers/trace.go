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
	"github.com/tokenbus/tokenbus/workers/engine"
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

// bounceSpan starts the span of a request the worker hands back, "bounce
// <model>", the child of the dispatch span in m's header, and puts its
// context in the header: the dispatch span of the next attempt is its child,
// so a trace shows why that attempt happened. The caller ends it.
func (w *Worker) bounceSpan(m *nats.Msg, reason string) trace.Span {
	_, span := tracer.StartFromHeader(context.Background(), m.Header, "bounce", trace.SpanKindConsumer)
	if span.IsRecording() {
		model := m.Header.Get(schemas.HdrModel)
		span.SetName("bounce " + model)
		span.SetAttributes(
			attribute.String(tracing.AttrMsgSystem, "nats"),
			attribute.String(tracing.AttrMsgDest, m.Subject),
			attribute.String(tracing.AttrMsgOperation, "process"),
			attribute.String(tracing.AttrRequestID, m.Header.Get(schemas.HdrRequestID)),
			attribute.String(tracing.AttrModel, model),
			attribute.String(tracing.AttrWorker, w.cfg.ID),
			attribute.String(tracing.AttrOutcome, "bounced"),
			attribute.String(tracing.AttrBounceReason, reason),
		)
	}
	tracing.InjectSpan(span, m.Header)
	return span
}

// record notes how c ended, on its span (ended by finish) and in the log:
// a line per request at Debug, at Warn for a server-side failure.
func (c *call) record(outcome string, err error, res *engine.Result) {
	var usage *schemas.Usage
	var pc prefixComparison
	if res != nil {
		usage = &res.Usage
		pc = c.comparePrefix(res)
	}
	span := c.span
	if span.IsRecording() {
		span.SetAttributes(attribute.String(tracing.AttrOutcome, outcome))
		if res != nil {
			setUsage(span, res)
		}
		if pc.ok {
			span.SetAttributes(attribute.Int(tracing.AttrPrefixPredicted, pc.predicted), attribute.Int(tracing.AttrPrefixCached, pc.actual))
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
		if res.UsageEstimated {
			attrs = append(attrs, slog.Bool("usage_estimated", true))
		}
	}
	if pc.ok {
		attrs = append(attrs, slog.Int("cached_tokens_predicted", pc.predicted), slog.Int("cached_tokens", pc.actual))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	log.LogAttrs(context.Background(), level, "request", attrs...)
}

// setUsage puts a finished request's token counts on span: counted, or
// marked estimated (the prompt's count then is unknown and left out).
func setUsage(span trace.Span, res *engine.Result) {
	if res.UsageEstimated {
		span.SetAttributes(attribute.Int(tracing.AttrOutputTokens, res.Usage.CompletionTokens),
			attribute.Bool(tracing.AttrUsageEstimated, true))
		return
	}
	span.SetAttributes(attribute.Int(tracing.AttrInputTokens, res.Usage.PromptTokens),
		attribute.Int(tracing.AttrOutputTokens, res.Usage.CompletionTokens))
}
