package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// switchEngine serves one of its models at a time (engine.Switcher); its
// requests block as gateEngine's do, and a switch waits for load (when
// set), so tests see each step of a switch.
type switchEngine struct {
	gateEngine
	can  []string
	load chan struct{} // nil: a switch is instant

	mu       sync.Mutex
	model    string
	switches []string // the models switched to, in order
	overlap  bool     // a switch began while a request ran
	inGen    atomic.Int64
}

func newSwitchEngine(models ...string) *switchEngine {
	return &switchEngine{gateEngine: gateEngine{release: make(chan struct{})}, can: models, model: models[0]}
}

func (e *switchEngine) Models() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return []string{e.model}
}

func (e *switchEngine) CanServe() []string { return e.can }

func (e *switchEngine) Switch(ctx context.Context, model string) error {
	if e.inGen.Load() > 0 {
		e.mu.Lock()
		e.overlap = true
		e.mu.Unlock()
	}
	if e.load != nil {
		select {
		case <-e.load:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.model = model
	e.switches = append(e.switches, model)
	return nil
}

func (e *switchEngine) switched() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.switches)
}

func (e *switchEngine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	e.inGen.Add(1)
	defer e.inGen.Add(-1)
	if m := e.Models()[0]; req.Model != m {
		return nil, schemas.ErrModelNotFound.New(req.Model)
	}
	return e.gateEngine.Generate(ctx, req, sink)
}

// wait waits until the last heartbeat is one ok accepts, and returns it.
func (b *beats) wait(t *testing.T, what string, ok func(schemas.Heartbeat) bool) schemas.Heartbeat {
	t.Helper()
	var hb schemas.Heartbeat
	testenv.WaitFor(t, 5*time.Second, func() error {
		b.mu.Lock()
		if len(b.all) > 0 {
			hb = b.all[len(b.all)-1]
		}
		b.mu.Unlock()
		if !ok(hb) {
			return fmt.Errorf("no heartbeat %s: last %+v", what, hb)
		}
		return nil
	})
	return hb
}

// switchTo asks worker w1 to switch to model: its reply's error, nil when accepted.
func switchTo(t *testing.T, nc *nats.Conn, model string) *schemas.Error {
	t.Helper()
	b, _ := json.Marshal(schemas.SwitchRequest{Model: model, Dispatcher: "test"})
	m, err := nc.Request(schemas.CtlSubject("w1", schemas.CtlSwitch), b, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return schemas.ReadCtlReply(m.Data, "w1", schemas.CtlSwitch)
}

func code(e *schemas.Error) string {
	if e == nil || e.Body.Code == nil {
		return ""
	}
	return *e.Body.Code
}

func TestSwitchRefusals(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := newSwitchEngine("a", "b")
	close(eng.release)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SwitchHold: time.Hour})

	if e := switchTo(t, nc, "x"); e == nil || e.Status != 400 || code(e) != "invalid_value" {
		t.Fatalf("switch to a model it cannot serve: %v", e)
	}
	if e := switchTo(t, nc, ""); e == nil || e.Status != 400 {
		t.Fatalf("switch to no model: %v", e)
	}
	// The model it serves: nothing to do, even within the hold.
	if e := switchTo(t, nc, "a"); e != nil {
		t.Fatalf("switch to the model loaded: %v", e)
	}
	// Another, within the hold: refused, saying when to ask again.
	e := switchTo(t, nc, "b")
	if e == nil || e.Status != 409 || code(e) != "switch_hold" || e.RetryAfter < 3500 || e.RetryAfter > 3600 {
		t.Fatalf("switch within the hold: %+v", e)
	}
	if got := eng.switched(); len(got) != 0 {
		t.Fatalf("the engine switched to %q", got)
	}
	if n := counterValue(w.sw.m.switches.WithLabelValues("a", "b", "refused_hold")); n != 1 {
		t.Fatalf("refused_hold counted %v times", n)
	}

	// A worker whose engine serves fixed models switches to nothing.
	nc2 := testenv.Connect(t, ns)
	fixed := &gateEngine{release: make(chan struct{})}
	close(fixed.release)
	startWorker(t, nc2, fixed, Config{ID: "w2"})
	b, _ := json.Marshal(schemas.SwitchRequest{Model: "m"})
	m, err := nc.Request(schemas.CtlSubject("w2", schemas.CtlSwitch), b, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e := schemas.ReadCtlReply(m.Data, "w2", schemas.CtlSwitch); e == nil || e.Status != 400 {
		t.Fatalf("switch on a worker of fixed models: %v", e)
	}
	hb := newWorkerBeat(t, nc, "w2")
	if hb.CanServe != nil || hb.LoadedAt != 0 || hb.HoldMS != 0 {
		t.Fatalf("a worker of fixed models advertises switching: %+v", hb)
	}
}

// newWorkerBeat waits for one heartbeat of worker id.
func newWorkerBeat(t *testing.T, nc *nats.Conn, id string) schemas.Heartbeat {
	t.Helper()
	ch := make(chan schemas.Heartbeat, 1)
	sub, err := nc.Subscribe(schemas.HeartbeatSubject(id), func(m *nats.Msg) {
		var hb schemas.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			select {
			case ch <- hb:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case hb := <-ch:
		return hb
	case <-time.After(5 * time.Second):
		t.Fatal("no heartbeat")
	}
	return schemas.Heartbeat{}
}

// A switch lets the running request finish on the old model, bounces new
// ones meanwhile, then loads the new model; the heartbeats say so at each
// step.
func TestSwitchDrainsThenSwitches(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := newSwitchEngine("a", "b")
	eng.load = make(chan struct{})
	hold := 50 * time.Millisecond
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", SwitchHold: hold, DrainTimeout: 10 * time.Second})
	hbs := watchBeats(t, nc)
	first := hbs.wait(t, "at start", func(hb schemas.Heartbeat) bool { return hb.LoadedAt != 0 })
	if !slices.Equal(first.CanServe, []string{"a", "b"}) || first.Switching != "" || first.HoldMS != 50 ||
		!slices.Equal(first.Models, []string{"a"}) {
		t.Fatalf("first heartbeat %+v", first)
	}

	running := send(t, nc, schemas.WorkSubject("w1"), "r1", map[string]string{schemas.HdrModel: "a"})
	testenv.WaitFor(t, 2*time.Second, wantTypes(running, schemas.FrameAccepted, schemas.FrameChunk))
	testenv.WaitFor(t, 2*time.Second, func() error {
		if held := time.Since(time.UnixMilli(first.LoadedAt)); held <= hold {
			return fmt.Errorf("loaded %s ago, hold %s", held, hold)
		}
		return nil
	})
	if e := switchTo(t, nc, "b"); e != nil {
		t.Fatalf("switch: %v", e)
	}
	hb := hbs.wait(t, "switching to b", func(hb schemas.Heartbeat) bool { return hb.Switching == "b" })
	if !slices.Equal(hb.Models, []string{"a"}) || hb.Running != 1 {
		t.Fatalf("while draining: %+v", hb)
	}
	// Asked again (another dispatcher): nothing more to do. Asked for
	// another model: refused while this one goes on.
	if e := switchTo(t, nc, "b"); e != nil {
		t.Fatalf("the same switch again: %v", e)
	}
	if e := switchTo(t, nc, "a"); e == nil || e.Status != 409 || code(e) != "switch_in_progress" {
		t.Fatalf("a switch back during the switch: %v", e)
	}

	// A new request for the old model goes back to its dispatcher; one
	// sent straight to the worker gets a 503 its client retries elsewhere.
	bounced := make(chan *nats.Msg, 1)
	sub, _ := nc.Subscribe("bounce.here", func(m *nats.Msg) { bounced <- m })
	defer sub.Unsubscribe()
	nc.Flush()
	late := send(t, nc, schemas.WorkSubject("w1"), "r2", map[string]string{schemas.HdrModel: "a", schemas.HdrBounce: "bounce.here"})
	select {
	case m := <-bounced:
		if m.Header.Get(schemas.HdrRequestID) != "r2" {
			t.Fatalf("bounced %+v", m.Header)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a request during the switch was not bounced")
	}
	direct := send(t, nc, schemas.WorkSubject("w1"), "r3", map[string]string{schemas.HdrModel: "a"})
	testenv.WaitFor(t, 2*time.Second, wantTypes(direct, schemas.FrameError))
	if e := schemas.ParseErrorPayload(direct.last().Payload); e.Status != 503 || code(e) != "shutting_down" {
		t.Fatalf("a request sent straight to a switching worker: %+v", e)
	}
	if len(late.types()) != 0 || len(eng.switched()) != 0 || w.Running() != 1 {
		t.Fatalf("late %v, switched %q, running %d: want the bounce alone, no switch while r1 runs", late.types(), eng.switched(), w.Running())
	}

	// r1 ends on the old model; only then does the engine switch.
	close(eng.release)
	testenv.WaitFor(t, 2*time.Second, wantTypes(running, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	close(eng.load)
	after := hbs.wait(t, "serving b", func(hb schemas.Heartbeat) bool { return slices.Equal(hb.Models, []string{"b"}) && hb.Switching == "" })
	if after.LoadedAt <= first.LoadedAt {
		t.Fatalf("loaded_at %d, was %d", after.LoadedAt, first.LoadedAt)
	}
	eng.mu.Lock()
	overlap := eng.overlap
	eng.mu.Unlock()
	if overlap || !slices.Equal(eng.switched(), []string{"b"}) {
		t.Fatalf("switched %q, overlapping a request %v", eng.switched(), overlap)
	}
	served := send(t, nc, schemas.WorkSubject("w1"), "r4", map[string]string{schemas.HdrModel: "b"})
	testenv.WaitFor(t, 2*time.Second, wantTypes(served, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	if n := counterValue(w.sw.m.switches.WithLabelValues("a", "b", "ok")); n != 1 {
		t.Fatalf("switches a→b ok: %v", n)
	}
	// Within the new hold, back to a is refused.
	if e := switchTo(t, nc, "a"); e == nil && time.Since(time.UnixMilli(after.LoadedAt)) < hold {
		t.Fatal("a switch back within the hold was accepted")
	}
}

// A request still running when the drain timeout passes is cancelled with
// an error its client retries elsewhere, and the switch goes on.
func TestSwitchDrainTimeoutCancels(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := newSwitchEngine("a", "b")
	defer close(eng.release)
	startWorker(t, nc, eng, Config{ID: "w1", SwitchHold: time.Nanosecond, DrainTimeout: 100 * time.Millisecond})
	hbs := watchBeats(t, nc)
	running := send(t, nc, schemas.WorkSubject("w1"), "r1", map[string]string{schemas.HdrModel: "a"})
	testenv.WaitFor(t, 2*time.Second, wantTypes(running, schemas.FrameAccepted, schemas.FrameChunk))
	if e := switchTo(t, nc, "b"); e != nil {
		t.Fatalf("switch: %v", e)
	}
	testenv.WaitFor(t, 5*time.Second, wantTypes(running, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameError))
	if e := schemas.ParseErrorPayload(running.last().Payload); e.Status != 503 || code(e) != "shutting_down" {
		t.Fatalf("the request cut off by the switch: %+v", e)
	}
	hbs.wait(t, "serving b", func(hb schemas.Heartbeat) bool { return slices.Equal(hb.Models, []string{"b"}) && hb.Switching == "" })
	if eng.canceled.Load() != 1 {
		t.Fatalf("cancelled %d requests in the engine, want 1", eng.canceled.Load())
	}
}

// A worker that stops during a switch ends it at once.
func TestSwitchEndsWithTheWorker(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := newSwitchEngine("a", "b")
	eng.load = make(chan struct{}) // never closed: only the worker's stop ends the load
	close(eng.release)
	w, cancel, done := startWorker(t, nc, eng, Config{ID: "w1", SwitchHold: time.Nanosecond})
	hbs := watchBeats(t, nc)
	if e := switchTo(t, nc, "b"); e != nil {
		t.Fatalf("switch: %v", e)
	}
	hbs.wait(t, "switching", func(hb schemas.Heartbeat) bool { return hb.Switching == "b" })
	cancel()
	select {
	case err := <-done:
		done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("the worker did not stop during a switch")
	}
	if n := counterValue(w.sw.m.switches.WithLabelValues("a", "b", "cancelled")); n != 1 {
		t.Fatalf("cancelled switches: %v", n)
	}
}
