package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// sleepyEngine is the sim (base model "b") with its sleeps and wake-ups
// counted, and wake-ups failing on demand.
type sleepyEngine struct {
	*sim.Engine
	sleeps, wakes atomic.Int64
	failWake      atomic.Bool
}

func (e *sleepyEngine) Sleep(ctx context.Context) error {
	e.sleeps.Add(1)
	return e.Engine.Sleep(ctx)
}

func (e *sleepyEngine) WakeUp(ctx context.Context) error {
	e.wakes.Add(1)
	if e.failWake.Load() {
		select { // long enough for the requests of a burst to share it
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
		return errors.New("CUDA out of memory")
	}
	return e.Engine.WakeUp(ctx)
}

// sleepySim is a sleepyEngine over a sim whose sleep and wake-up take the
// times given.
func sleepySim(t *testing.T, sleepTime, wakeTime time.Duration) *sleepyEngine {
	t.Helper()
	c := sim.DefaultConfig()
	c.Model = "b"
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq = 0, 0, time.Millisecond, 0
	c.MaxLoras, c.AdapterLoadTime = 2, 5*time.Millisecond
	c.SleepTime, c.WakeTime = sleepTime, wakeTime
	e, err := sim.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return &sleepyEngine{Engine: e}
}

// waitBeat waits for a heartbeat of w1 that passes ok.
func waitBeat(t *testing.T, b *beats, what string, ok func(schemas.Heartbeat) bool) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !b.seen(ok) {
			return errors.New("no heartbeat " + what)
		}
		return nil
	})
}

// asleepNow waits until the worker's engine sleeps.
func asleepNow(t *testing.T, w *Worker, eng *sleepyEngine) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb := w.Heartbeat(); !hb.Sleeping || !eng.Sleeping() {
			return fmt.Errorf("heartbeat sleeping %v, engine sleeping %v", hb.Sleeping, eng.Sleeping())
		}
		return nil
	})
}

// Idle for SleepAfter, the engine sleeps and the heartbeat says so; never
// while a request runs. The next request wakes it, waits for the wake-up
// and completes; the heartbeat gives the wake-up's time, and the engine
// sleeps again after another idle spell.
func TestSleepWhenIdleWakeOnRequest(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	const after, wake = 300 * time.Millisecond, 200 * time.Millisecond
	eng := sleepySim(t, 0, wake)
	b := watchBeats(t, nc)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SleepAfter: after})

	// A request of about 600 ms (1 ms a token) runs past SleepAfter: no
	// sleep under it.
	start := time.Now()
	long := ask(t, nc, "long", "b", "", 600)
	wantDone(t, long)
	if endTime("long").Sub(start) < after {
		t.Fatalf("the long request took %v: the test needs it past SleepAfter", endTime("long").Sub(start))
	}
	if n := eng.sleeps.Load(); n != 0 || b.seen(func(h schemas.Heartbeat) bool { return h.Sleeping }) {
		t.Fatalf("slept %d times while a request ran", n)
	}
	idleFrom := endTime("long")
	waitBeat(t, b, "sleeping", func(h schemas.Heartbeat) bool { return h.Sleeping && h.Healthy })
	if slept := time.Since(idleFrom); slept < after-50*time.Millisecond { // the client saw the end a moment after the worker
		t.Fatalf("asleep %v after the last request, before SleepAfter %v", slept, after)
	}
	// The heartbeat says sleeping from the start of the sleep; the count
	// comes once the engine's Sleep has returned.
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := counterValue(w.sleep.sleeps); n != 1 {
			return fmt.Errorf("tokenbus_worker_sleeps_total %v", n)
		}
		return nil
	})

	start = time.Now()
	f := ask(t, nc, "r1", "b", "", 2)
	wantDone(t, f)
	if took := endTime("r1").Sub(start); took < wake {
		t.Fatalf("a request to a sleeping engine took %v, less than its wake-up %v", took, wake)
	}
	if n := eng.wakes.Load(); n != 1 {
		t.Fatalf("%d wake-ups", n)
	}
	hb := w.Heartbeat()
	if hb.Sleeping || hb.WakeMS < int(wake/time.Millisecond) {
		t.Fatalf("after the wake-up: sleeping %v, wake_ms %d (want ≥ %v)", hb.Sleeping, hb.WakeMS, wake)
	}
	if n := counterValue(w.sleep.wakeups.WithLabelValues("ok")); n != 1 {
		t.Fatalf("wake-ups ok %v", n)
	}
	asleepNow(t, w, eng)
	if n := eng.sleeps.Load(); n != 2 {
		t.Fatalf("%d sleeps, want 2", n)
	}
}

// Requests that find the engine asleep share one wake-up; one that arrives
// while it falls asleep waits for the sleep to end, then for the wake-up.
func TestConcurrentRequestsShareOneWakeUp(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := sleepySim(t, 300*time.Millisecond, 100*time.Millisecond)
	b := watchBeats(t, nc)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SleepAfter: 100 * time.Millisecond})

	// The heartbeat says sleeping as soon as the sleep begins; the sim
	// takes 300 ms to fall asleep.
	waitBeat(t, b, "sleeping", func(h schemas.Heartbeat) bool { return h.Sleeping })
	testenv.WaitFor(t, time.Second, func() error { // the beat may come a moment before the engine's Sleep is called
		if n := eng.sleeps.Load(); n != 1 {
			return fmt.Errorf("%d sleeps under way", n)
		}
		return nil
	})
	falling := ask(t, nc, "falling", "b", "", 2)
	wantDone(t, falling)
	if n := eng.wakes.Load(); n != 1 {
		t.Fatalf("%d wake-ups for a request that came while falling asleep", n)
	}
	asleepNow(t, w, eng)
	var fs []*frames
	for i := range 8 {
		fs = append(fs, ask(t, nc, fmt.Sprint("c", i), "b", "", 2))
	}
	for _, f := range fs {
		wantDone(t, f)
	}
	if n := eng.wakes.Load(); n != 2 {
		t.Fatalf("%d wake-ups in all, want 2: the 8 concurrent requests share one", n)
	}
}

// A request's deadline bounds its wait for a wake-up; the wake-up goes on,
// and the next request finds the engine awake.
func TestWakeUpWaitBoundedByDeadline(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	const wake = 500 * time.Millisecond
	eng := sleepySim(t, 0, wake)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SleepAfter: 50 * time.Millisecond})
	asleepNow(t, w, eng)
	start := time.Now()
	f := send(t, nc, schemas.WorkSubject("w1"), "hurried", map[string]string{
		schemas.HdrModel: "b", schemas.HdrDeadline: schemas.FormatDeadline(time.Now().Add(100 * time.Millisecond))})
	last := ended(t, f)
	if took := time.Since(start); last.Type != schemas.FrameError || took > wake-100*time.Millisecond {
		t.Fatalf("ended with %s %s after %v: want an error at its deadline, before the wake-up's end", last.Type, last.Payload, took)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if w.Heartbeat().Sleeping {
			return errors.New("still asleep")
		}
		return nil
	})
	if eng.wakes.Load() != 1 {
		t.Fatalf("%d wake-ups", eng.wakes.Load())
	}
}

// A wake-up that fails fails the requests waiting for it with a retryable
// error, one WakeUp for all of them; the worker is unhealthy until a
// wake-up succeeds, which it tries by itself.
func TestFailedWakeUp(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := sleepySim(t, 0, 20*time.Millisecond)
	eng.failWake.Store(true)
	b := watchBeats(t, nc)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SleepAfter: 50 * time.Millisecond})
	asleepNow(t, w, eng)
	var fs []*frames
	for i := range 3 {
		fs = append(fs, ask(t, nc, fmt.Sprint("f", i), "b", "", 2))
	}
	for _, f := range fs {
		last := ended(t, f)
		e := schemas.ParseErrorPayload(last.Payload)
		if last.Type != schemas.FrameError || e.Status != 503 || e.Body.Code == nil || *e.Body.Code != "engine_unhealthy" ||
			e.RetryAfter == 0 || !strings.Contains(e.Body.Message, "CUDA out of memory") {
			t.Fatalf("ended with %s %s: want a retryable engine_unhealthy", last.Type, last.Payload)
		}
	}
	if n := eng.wakes.Load(); n != 1 {
		t.Fatalf("%d wake-ups for three requests waiting together", n)
	}
	waitBeat(t, b, "unhealthy and asleep", func(h schemas.Heartbeat) bool { return !h.Healthy && h.Sleeping })
	if n := counterValue(w.sleep.wakeups.WithLabelValues("error")); n != 1 {
		t.Fatalf("wake-ups failed %v", n)
	}
	// The engine recovers: the worker's own retry (after 1 s) wakes it.
	eng.failWake.Store(false)
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb := w.Heartbeat(); !hb.Healthy || hb.Sleeping {
			return fmt.Errorf("healthy %v, sleeping %v", hb.Healthy, hb.Sleeping)
		}
		return nil
	})
	wantDone(t, ask(t, nc, "after", "b", "", 2))
}

// A control load of an adapter wakes a sleeping engine (and keeps it
// awake for the load); an engine that cannot sleep is refused at start.
func TestControlWakesAndEngineMustSleep(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := sleepySim(t, 0, 20*time.Millisecond)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SleepAfter: 50 * time.Millisecond})
	asleepNow(t, w, eng)
	if r := ctl(t, nc, schemas.CtlLoadAdapter, schemas.AdapterRequest{Name: "x", Base: "b", Path: "sim://x"}); !r.OK {
		t.Fatalf("load while asleep: %+v", r.Error)
	}
	if eng.wakes.Load() != 1 || !strings.Contains(strings.Join(eng.Models(), ","), "x") {
		t.Fatalf("%d wake-ups, models %v", eng.wakes.Load(), eng.Models())
	}

	_, err := New(Config{ID: "w2", SleepAfter: time.Second}, nc, &gateEngine{}, nil)
	if err == nil || !strings.Contains(err.Error(), "gate engine cannot sleep") {
		t.Fatalf("New with an engine that cannot sleep: %v", err)
	}
}

// A sim of two models asleep, switched: the switch loads the new model
// awake, and the worker takes the engine's word (no wake-up of the old
// model first, no sleep during the switch); the new model's request runs
// with no wake-up either.
func TestSwitchWakesWithTheNewModel(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	c := sim.DefaultConfig()
	c.Models, c.Model = []string{"a", "b"}, ""
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq = 0, 0, time.Millisecond, 0
	c.SleepTime, c.WakeTime, c.SwitchTime = 0, 50*time.Millisecond, 200*time.Millisecond
	e, err := sim.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	eng := &sleepyEngine{Engine: e}
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SleepAfter: 50 * time.Millisecond, SwitchHold: time.Millisecond})
	asleepNow(t, w, eng)
	sleeps := eng.sleeps.Load()
	if err := switchTo(t, nc, "b"); err != nil {
		t.Fatalf("switch: %+v", err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb := w.Heartbeat(); hb.Sleeping || hb.Switching != "" || !slices.Contains(hb.Models, "b") {
			return fmt.Errorf("heartbeat: sleeping %v, switching %q, models %v", hb.Sleeping, hb.Switching, hb.Models)
		}
		return nil
	})
	if n := eng.wakes.Load(); n != 0 {
		t.Fatalf("%d wake-ups: the old model was woken for a switch", n)
	}
	if n := eng.sleeps.Load(); n != sleeps {
		t.Fatalf("slept during the switch")
	}
	wantDone(t, ask(t, nc, "r1", "b", "", 2))
	if n := eng.wakes.Load(); n != 0 {
		t.Fatalf("%d wake-ups for a request to the model just switched to", n)
	}
	asleepNow(t, w, eng) // and it sleeps again when idle
}
