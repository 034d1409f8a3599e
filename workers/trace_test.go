package workers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

// A request the worker hands back leaves a span, "bounce <model>", the child
// of the dispatch span, and the request goes back with the bounce span's
// context: the next dispatch span is its child, so a trace shows why the
// next attempt happened.
func TestBounceSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	uninstall := tracing.Install(tp)
	t.Cleanup(func() { uninstall(); _ = tp.Shutdown(context.Background()) })

	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	defer close(eng.release)
	startWorker(t, nc, eng, Config{ID: "w1", MaxConcurrency: 1})
	first := send(t, nc, schemas.WorkSubject("w1"), "r1", nil)
	testenv.WaitFor(t, 2*time.Second, wantTypes(first, schemas.FrameAccepted, schemas.FrameChunk))

	bounced := make(chan *nats.Msg, 1)
	nc.Subscribe("bounce.here", func(m *nats.Msg) { bounced <- m })
	nc.Flush()
	const traceID, dispatchSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	send(t, nc, schemas.WorkSubject("w1"), "r2", map[string]string{
		schemas.HdrBounce: "bounce.here", schemas.HdrTrace: "00-" + traceID + "-" + dispatchSpan + "-01"})
	var back *nats.Msg
	select {
	case back = <-bounced:
	case <-time.After(2 * time.Second):
		t.Fatal("not bounced")
	}

	// The span ends once the bounce is published: it may end a moment
	// after the message arrived here.
	var span sdktrace.ReadOnlySpan
	testenv.WaitFor(t, 2*time.Second, func() error {
		for _, s := range rec.Ended() {
			if s.Name() == "bounce m" {
				span = s
				return nil
			}
		}
		return fmt.Errorf("no bounce span among %d", len(rec.Ended()))
	})
	attrs := map[string]string{}
	for _, kv := range span.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if span.Parent().SpanID().String() != dispatchSpan || span.SpanContext().TraceID().String() != traceID ||
		attrs[tracing.AttrOutcome] != "bounced" || attrs[tracing.AttrBounceReason] != "full" ||
		attrs[tracing.AttrWorker] != "w1" || attrs[tracing.AttrRequestID] != "r2" {
		t.Fatalf("bounce span: parent %s, trace %s, attributes %v", span.Parent().SpanID(), span.SpanContext().TraceID(), attrs)
	}
	if want := "00-" + traceID + "-" + span.SpanContext().SpanID().String() + "-01"; back.Header.Get(schemas.HdrTrace) != want {
		t.Fatalf("bounced with traceparent %q, want the bounce span's %q", back.Header.Get(schemas.HdrTrace), want)
	}
}
