package dispatcher

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// queuedFrames returns the queued frames r got.
func (r *replies) queuedFrames() []schemas.Queued {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []schemas.Queued
	for _, f := range r.frames {
		if f.Type == schemas.FrameQueued {
			var q schemas.Queued
			_ = json.Unmarshal(f.Payload, &q)
			out = append(out, q)
		}
	}
	return out
}

// demandLog records the demand events published for a model.
type demandLog struct {
	mu  sync.Mutex
	evs []schemas.Demand
}

func watchDemand(t *testing.T, nc *nats.Conn, model string) *demandLog {
	l := &demandLog{}
	if _, err := nc.Subscribe(schemas.DemandSubject(model), func(m *nats.Msg) {
		var ev schemas.Demand
		if json.Unmarshal(m.Data, &ev) == nil {
			l.mu.Lock()
			l.evs = append(l.evs, ev)
			l.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *demandLog) last() (schemas.Demand, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.evs) == 0 {
		return schemas.Demand{}, 0
	}
	return l.evs[len(l.evs)-1], len(l.evs)
}

// A request for a registered model that no worker serves waits for one:
// its client hears it is held (cold, with beats), the demand is announced
// at once and again every beat, and the worker that comes up gets every
// held request.
func TestHoldForCapacity(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	demand := watchDemand(t, nc, "known-idle")
	d := startDispatcher(t, nc, Config{HoldBeat: 200 * time.Millisecond})
	sent := time.Now()
	var rs []*replies
	for i := range 3 {
		rs = append(rs, sendRequest(t, nc, "known-idle", fmt.Sprintf("h%d", i)))
	}
	testenv.WaitFor(t, time.Second, func() error {
		ev, n := demand.last()
		if n == 0 || ev.Waiting == 0 {
			return fmt.Errorf("no demand event yet (%d)", n)
		}
		return nil
	})
	if took := time.Since(sent); took > time.Second {
		t.Fatalf("the first demand event came %v after the first request, want within 1s", took)
	}
	// Held, not refused: queued frames say cold and come again every beat.
	for _, r := range rs {
		testenv.WaitFor(t, 2*time.Second, func() error {
			qs := r.queuedFrames()
			if len(qs) < 2 {
				return fmt.Errorf("%d queued frames, want the first and a beat", len(qs))
			}
			for _, q := range qs {
				if !q.Cold || q.BeatMS != 200 || q.TimeoutMS < int64(4*time.Minute/time.Millisecond) {
					return fmt.Errorf("queued frame %+v: want cold, beat 200ms, the 5m cold-start limit", q)
				}
			}
			return nil
		})
		if f, _ := r.last(); f.Type == schemas.FrameError {
			t.Fatalf("a held request was refused: %s", f.Payload)
		}
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		ev, _ := demand.last()
		if ev.Waiting != 3 || ev.OldestMS <= 0 || ev.Dispatcher != d.ID() {
			return fmt.Errorf("demand %+v, want 3 waiting", ev)
		}
		return nil
	})
	// A worker comes up: it gets them all, and the demand falls to 0.
	w := &fakeWorker{id: "late", nc: nc}
	sub, err := nc.Subscribe(schemas.WorkSubject("late"), func(m *nats.Msg) {
		w.mu.Lock()
		w.got = append(w.got, m)
		w.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b, _ := json.Marshal(schemas.Heartbeat{Worker: "late", Models: []string{"known-idle"}, MaxConcurrency: 8, Healthy: true, IntervalMS: 1000})
	if err := nc.Publish(schemas.HeartbeatSubject("late"), b); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 3))
	testenv.WaitFor(t, 2*time.Second, func() error {
		if ev, _ := demand.last(); ev.Waiting != 0 {
			return fmt.Errorf("demand %+v after the worker took every request, want 0 waiting", ev)
		}
		return nil
	})
}

// A held request waits no longer than the cold-start timeout, nor past its
// deadline.
func TestHoldTimesOut(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	startDispatcher(t, nc, Config{ColdStartTimeout: 300 * time.Millisecond})
	start := time.Now()
	r := sendRequest(t, nc, "known-idle", "t1")
	testenv.WaitFor(t, 3*time.Second, wantError(r, 503, "cold_start_timeout"))
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("refused after %v, before the cold-start timeout", took)
	}
	// A deadline shorter than the cold-start timeout wins.
	nc2 := testenv.Connect(t, ns)
	inbox := nats.NewInbox()
	got := make(chan schemas.Frame, 8)
	nc2.Subscribe(inbox, func(m *nats.Msg) {
		f, _ := schemas.ParseFrame(m.Data)
		f.Payload = append([]byte(nil), f.Payload...)
		got <- f
	})
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, "t2")
	h.Set(schemas.HdrKind, "chat")
	h.Set(schemas.HdrDeadline, schemas.FormatDeadline(time.Now().Add(150*time.Millisecond)))
	if err := nc2.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("known-idle"), Reply: inbox, Header: h,
		Data: []byte(`{"model":"known-idle","messages":[{"role":"user","content":"hi"}]}`)}); err != nil {
		t.Fatal(err)
	}
	for f := range got {
		if f.Type != schemas.FrameQueued {
			if e := schemas.ParseErrorPayload(f.Payload); f.Type != schemas.FrameError || e.Status != 503 {
				t.Fatalf("frame %s %s", f.Type, f.Payload)
			}
			break
		}
		var q schemas.Queued
		if json.Unmarshal(f.Payload, &q); q.TimeoutMS > 150 {
			t.Fatalf("held with a limit of %dms past its 150ms deadline", q.TimeoutMS)
		}
	}
}

// A request queued behind a busy worker gets the hold's limit when its
// model's last worker goes away, instead of the queue timeout.
func TestQueuedRequestGoesCold(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{QueueTimeout: 500 * time.Millisecond, HoldBeat: 100 * time.Millisecond})
	w := newFakeWorker(t, nc, "busy", 1)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 1 {
			return fmt.Errorf("worker not seen")
		}
		return nil
	})
	sendRequest(t, nc, "m", "first") // takes the only slot
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	r := sendRequest(t, nc, "m", "second") // queued behind it, for 500 ms
	testenv.WaitFor(t, time.Second, func() error {
		if qs := r.queuedFrames(); len(qs) == 0 || qs[0].Cold {
			return fmt.Errorf("queued frames %+v: want one, not cold", qs)
		}
		return nil
	})
	// The worker leaves (drained, idle): the request now waits for capacity.
	b, _ := json.Marshal(schemas.Heartbeat{Worker: "busy", Models: []string{"m"}, MaxConcurrency: 1, Draining: true, Healthy: true, IntervalMS: 1000})
	if err := nc.Publish(schemas.HeartbeatSubject("busy"), b); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		qs := r.queuedFrames()
		if last := qs[len(qs)-1]; !last.Cold || last.TimeoutMS < int64(time.Minute/time.Millisecond) {
			return fmt.Errorf("last queued frame %+v: want cold, with the cold-start limit", last)
		}
		return nil
	})
	if f, _ := r.last(); f.Type == schemas.FrameError {
		t.Fatalf("refused after its queue timeout though held for capacity: %s", f.Payload)
	}
}
