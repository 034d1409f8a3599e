package dispatcher

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func TestChooseSwitch(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	long := now.Add(-time.Hour).UnixMilli() // loaded long ago: its hold has passed
	// w is a worker serving model, able to serve a, b and c.
	w := func(id, model string, running int, edit ...func(*fleet.Worker)) fleet.Worker {
		x := fleet.Worker{Heartbeat: schemas.Heartbeat{Worker: id, Models: []string{model}, CanServe: []string{"a", "b", "c"},
			Running: running, Healthy: true, LoadedAt: long, HoldMS: 30_000}, Load: running}
		for _, f := range edit {
			f(&x)
		}
		return x
	}
	switching := func(to string) func(*fleet.Worker) { return func(x *fleet.Worker) { x.Switching = to } }
	for _, tc := range []struct {
		name    string
		workers []fleet.Worker
		queued  map[string]int
		want    string // "": none
	}{
		{"none can serve it", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.CanServe = []string{"b", "c"} })}, nil, ""},
		{"the only candidate", []fleet.Worker{w("w1", "b", 0)}, nil, "w1"},
		{"a prefill worker serves no request whole", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.Role = schemas.RolePrefill })}, nil, ""},
		{"idle before busy", []fleet.Worker{w("w1", "b", 1), w("w2", "c", 0)}, nil, "w2"},
		{"idle before busy, whatever waits for it", []fleet.Worker{w("w1", "b", 3), w("w2", "c", 0)}, map[string]int{"c": 50}, "w2"},
		{"least queued for the model it holds", []fleet.Worker{w("w1", "b", 0), w("w2", "c", 0)}, map[string]int{"b": 3, "c": 1}, "w2"},
		{"then least running", []fleet.Worker{w("w1", "b", 5), w("w2", "c", 2)}, map[string]int{"b": 1, "c": 1}, "w2"},
		{"ties to the lowest id", []fleet.Worker{w("w2", "c", 0), w("w1", "b", 0), w("w3", "b", 0)}, nil, "w1"},
		{"the load estimate counts as running", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.Load = 2 }), w("w2", "c", 0)}, nil, "w2"},
		{"within its hold", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.LoadedAt = now.Add(-10 * time.Second).UnixMilli() })}, nil, ""},
		{"hold just over", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.LoadedAt = now.Add(-30 * time.Second).UnixMilli() })}, nil, "w1"},
		{"one in its hold, one busy out of it", []fleet.Worker{
			w("w1", "b", 0, func(x *fleet.Worker) { x.LoadedAt = now.UnixMilli() }), w("w2", "c", 4)}, nil, "w2"},
		{"one switching to it already", []fleet.Worker{w("w1", "b", 0, switching("a")), w("w2", "c", 0)}, nil, ""},
		{"one switching elsewhere is no candidate", []fleet.Worker{w("w1", "b", 0, switching("c")), w("w2", "c", 2)}, nil, "w2"},
		{"draining, unhealthy: no candidates", []fleet.Worker{
			w("w1", "b", 0, func(x *fleet.Worker) { x.Draining = true }),
			w("w2", "c", 0, func(x *fleet.Worker) { x.Healthy = false })}, nil, ""},
		{"serving it already (unhealthy) is no candidate", []fleet.Worker{
			w("w1", "a", 0, func(x *fleet.Worker) { x.Healthy = false }), w("w2", "b", 1)}, nil, "w2"},
		{"demand of every model it serves", []fleet.Worker{
			w("w1", "b", 0, func(x *fleet.Worker) { x.Models = []string{"b", "b-lora"} }), w("w2", "c", 0)},
			map[string]int{"b": 1, "b-lora": 2, "c": 2}, "w2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queued := map[string]int{"a": 5}
			for m, n := range tc.queued {
				queued[m] = n
			}
			got, ok := chooseSwitch("a", tc.workers, queued, now)
			if ok != (tc.want != "") || got != tc.want {
				t.Fatalf("chose %q (%v), want %q", got, ok, tc.want)
			}
		})
	}
}

func TestSwitchAsksOneAtATime(t *testing.T) {
	var s switchAsks
	now := time.Now()
	if !s.begin("a", now) {
		t.Fatal("first ask refused")
	}
	if s.begin("a", now) {
		t.Fatal("a second ask for a while the first is in flight")
	}
	if !s.begin("b", now) {
		t.Fatal("an ask for another model refused")
	}
	s.end("a", time.Minute)
	if s.begin("a", time.Now().Add(30*time.Second)) {
		t.Fatal("asked again before the answer's wait ended")
	}
	if !s.begin("a", time.Now().Add(2*time.Minute)) {
		t.Fatal("not asked again after the wait")
	}
	// An ask never answered (end not called) frees the model in time.
	if !s.begin("b", now.Add(switchAskTimeout+switchSettle)) {
		t.Fatal("an unanswered ask held the model for good")
	}
}

// switchWorker is a fake worker of models m and sw: it heartbeats as told,
// counts the switches asked of it, answers them with reply, and records
// the requests it gets.
type switchWorker struct {
	*fakeWorker
	asked chan schemas.SwitchRequest
	reply schemas.CtlReply
}

func newSwitchWorker(t *testing.T, nc *nats.Conn, id string) *switchWorker {
	w := &switchWorker{fakeWorker: newFakeWorker(t, nc, id, 8), asked: make(chan schemas.SwitchRequest, 8), reply: schemas.CtlReply{OK: true}}
	if _, err := nc.Subscribe(schemas.CtlSubject(id, schemas.CtlSwitch), func(m *nats.Msg) {
		var req schemas.SwitchRequest
		_ = json.Unmarshal(m.Data, &req)
		w.asked <- req
		b, _ := json.Marshal(w.reply)
		_ = m.Respond(b)
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *switchWorker) beatAs(t *testing.T, model, switching string, running int, loadedAt time.Time) {
	b, _ := json.Marshal(schemas.Heartbeat{Worker: w.id, Models: []string{model}, CanServe: []string{"m", "sw"}, Switching: switching,
		LoadedAt: loadedAt.UnixMilli(), HoldMS: 1000, MaxConcurrency: 8, Running: running, Healthy: true, IntervalMS: 1000})
	if err := w.nc.Publish(schemas.HeartbeatSubject(w.id), b); err != nil {
		t.Fatal(err)
	}
	w.nc.Flush()
}

// A request for a model no worker serves, that two can switch to, is held;
// the dispatcher asks the idle one to switch (once), and the request goes
// to it once its heartbeat serves the model.
func TestSwitchForWaitingRequests(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{})
	long := time.Now().Add(-time.Hour)
	idle, busy := newSwitchWorker(t, nc, "idle"), newSwitchWorker(t, nc, "busy")
	idle.beatAs(t, "m", "", 0, long)
	busy.beatAs(t, "m", "", 3, long)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := d.Fleet().Switchable("sw"); n != 2 {
			return fmt.Errorf("%d switchable", n)
		}
		return nil
	})
	r := sendRequest(t, nc, "sw", "s1")
	var req schemas.SwitchRequest
	select {
	case req = <-idle.asked:
	case req = <-busy.asked:
		t.Fatal("the busy worker was asked to switch")
	case <-time.After(3 * time.Second):
		t.Fatal("no switch asked")
	}
	if req.Model != "sw" || req.Dispatcher != d.ID() {
		t.Fatalf("asked %+v", req)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if v := counterValue(d.m.switchRequests.WithLabelValues("accepted")); v != 1 {
			return fmt.Errorf("%v accepted", v)
		}
		return nil
	})
	idle.beatAs(t, "m", "sw", 0, long) // switching: the held request waits for it
	testenv.WaitFor(t, 2*time.Second, func() error {
		if f, n := r.last(); n == 0 || f.Type != schemas.FrameQueued {
			return fmt.Errorf("%d frames, the last %s: want queued", n, f.Type)
		}
		return nil
	})
	idle.beatAs(t, "sw", "", 0, time.Now())
	testenv.WaitFor(t, 2*time.Second, wantCount(idle.fakeWorker, 1))
	if len(idle.asked)+len(busy.asked) != 0 {
		t.Fatalf("asked again: %d, %d", len(idle.asked), len(busy.asked))
	}
	if busy.count() != 0 {
		t.Fatal("the busy worker got the request")
	}
}

// A refusal (the worker's hold) keeps the dispatcher from asking again
// before its Retry-After.
func TestSwitchRefusedWaitsRetryAfter(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{})
	w := newSwitchWorker(t, nc, "w")
	w.reply = schemas.CtlReply{Error: schemas.ErrSwitchHold.New("w", "m", "1s", "30s").WithRetryAfter(60)}
	w.beatAs(t, "m", "", 0, time.Now().Add(-time.Hour)) // its clock and ours disagree: it refuses
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := d.Fleet().Switchable("sw"); n != 1 {
			return fmt.Errorf("%d switchable", n)
		}
		return nil
	})
	sendRequest(t, nc, "sw", "s1")
	select {
	case <-w.asked:
	case <-time.After(3 * time.Second):
		t.Fatal("no switch asked")
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if v := counterValue(d.m.switchRequests.WithLabelValues("refused")); v != 1 {
			return fmt.Errorf("%v refused", v)
		}
		return nil
	})
	// Sweeps every 100 ms; the hold says a minute.
	d.switches.mu.Lock()
	until := d.switches.until["sw"]
	d.switches.mu.Unlock()
	if left := time.Until(until); left < 50*time.Second {
		t.Fatalf("asks again in %v, want after the worker's Retry-After of 60s", left)
	}
	if len(w.asked) != 0 {
		t.Fatal("asked again at once")
	}
}
