package dispatcher

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

// The dispatch span: a child of the request's traceparent, written back into
// the header the worker gets, ended when the request is forwarded (after any
// wait in the queue) or refused (with the error).
func TestDispatchSpans(t *testing.T) {
	rcv := testenv.RecordSpans(t)
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{QueueSize: 1, QueueTimeout: 5 * time.Second})
	a := newFakeWorker(t, nc, "a", 1)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 1 {
			return fmt.Errorf("worker not seen")
		}
		return nil
	})
	send := func(id, traceID string) *replies {
		r := &replies{}
		inbox := nats.NewInbox()
		nc.Subscribe(inbox, func(m *nats.Msg) {
			f, _ := schemas.ParseFrame(m.Data)
			f.Payload = append([]byte(nil), f.Payload...)
			r.mu.Lock()
			r.frames = append(r.frames, f)
			r.mu.Unlock()
		})
		h := nats.Header{}
		h.Set(schemas.HdrRequestID, id)
		h.Set(schemas.HdrKind, "chat")
		h[schemas.HdrTrace] = []string{"00-" + traceID + "-00000000000000aa-01"}
		if err := nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("m"), Reply: inbox, Header: h, Data: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	const (
		routed  = "11111111111111111111111111111111"
		waited  = "22222222222222222222222222222222"
		refused = "33333333333333333333333333333333"
	)
	send("r1", routed)
	testenv.WaitFor(t, 2*time.Second, wantCount(a, 1))
	q := send("r2", waited) // a is full: r2 waits
	testenv.WaitFor(t, 2*time.Second, func() error {
		if f, _ := q.last(); f.Type != schemas.FrameQueued {
			return fmt.Errorf("r2 not queued")
		}
		return nil
	})
	full := send("r3", refused)
	testenv.WaitFor(t, 2*time.Second, wantError(full, 503, schemas.CodeQueueFull))
	a.done(t, 0)
	testenv.WaitFor(t, 2*time.Second, wantCount(a, 2))

	a.mu.Lock()
	fwd := []*nats.Msg{a.got[0], a.got[1]}
	a.mu.Unlock()
	for i, tc := range []struct {
		traceID string
		queued  string
	}{{routed, ""}, {waited, "true"}} {
		s := oneSpan(t, rcv, tc.traceID)
		if s.Name != "dispatch m" || s.Kind != "consumer" || s.ParentSpanID != "00000000000000aa" || s.StatusError ||
			s.Attrs[tracing.AttrWorker] != "a" || s.Attrs[tracing.AttrQueued] != tc.queued || s.Attrs[tracing.AttrDispatcher] != d.ID() {
			t.Errorf("dispatch span %+v", s)
		}
		if want := "00-" + tc.traceID + "-" + s.SpanID + "-01"; fwd[i].Header.Get(schemas.HdrTrace) != want {
			t.Errorf("the worker got traceparent %q, want the dispatch span's %q", fwd[i].Header.Get(schemas.HdrTrace), want)
		}
	}
	if s := oneSpan(t, rcv, refused); !s.StatusError || s.Attrs["error.type"] != schemas.CodeQueueFull {
		t.Fatalf("refused request's span: %+v", s)
	}
}

// oneSpan waits for the one span of trace (the dispatcher ends a span just
// after it publishes).
func oneSpan(t *testing.T, l *testenv.SpanLog, traceID string) testenv.Span {
	t.Helper()
	var spans []testenv.Span
	testenv.WaitFor(t, 2*time.Second, func() error {
		if spans = l.Trace(traceID); len(spans) != 1 {
			return fmt.Errorf("trace %s: %d spans: %+v", traceID, len(spans), spans)
		}
		return nil
	})
	return spans[0]
}
