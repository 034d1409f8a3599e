package dispatcher

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/internal/tracing"
)

var tracer = tracing.NewTracer("github.com/tokenbus/tokenbus/dispatcher")

// startSpan starts r's consumer span "dispatch <model>", the child of the
// trace context in its header (the gateway's span; the previous dispatch span
// for a bounced request). forward writes the span's context into the header
// the worker gets; every other end of the request ends the span too.
func (d *Dispatcher) startSpan(r *request) {
	_, span := tracer.StartFromHeader(context.Background(), r.msg.Header, "dispatch", trace.SpanKindConsumer)
	if span.IsRecording() {
		span.SetName("dispatch " + r.model)
		span.SetAttributes(
			attribute.String(tracing.AttrMsgSystem, "nats"),
			attribute.String(tracing.AttrMsgDest, r.msg.Subject),
			attribute.String(tracing.AttrMsgOperation, "process"),
			attribute.String(tracing.AttrRequestID, r.id),
			attribute.String(tracing.AttrModel, r.model),
			attribute.String(tracing.AttrDispatcher, d.cfg.ID),
			attribute.Int(tracing.AttrAttempt, r.attempt),
		)
	}
	r.span = span
}

// spanQueued notes on span that its request waits in a queue.
func spanQueued(span trace.Span, position int) {
	if span != nil && span.IsRecording() {
		span.SetAttributes(attribute.Bool(tracing.AttrQueued, true))
		span.AddEvent("queued", trace.WithAttributes(attribute.Int("tokenbus.queue.position", position)))
	}
}

// endSpan ends span: forwarded to worker, failed with err, or neither (outcome).
func endSpan(span trace.Span, worker string, err error, outcome string) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		if worker != "" {
			span.SetAttributes(attribute.String(tracing.AttrWorker, worker))
		}
		if outcome != "" {
			span.SetAttributes(attribute.String(tracing.AttrOutcome, outcome))
		}
		tracing.Fail(span, err)
	}
	span.End()
}
