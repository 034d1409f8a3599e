package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// simEngine is the real sim engine serving base model "b", with maxLoras
// slots, adapter loads taking loadTime and decode steps taking step.
func simEngine(t *testing.T, maxLoras int, loadTime, step time.Duration) *sim.Engine {
	t.Helper()
	c := sim.DefaultConfig()
	c.Model = "b"
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq = 0, 0, step, 0
	c.MaxLoras, c.AdapterLoadTime = maxLoras, loadTime
	e, err := sim.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// ask sends a streaming chat request for model to worker w1, as a
// dispatcher forwards it: with the adapter's path (and base) if path is set.
func ask(t *testing.T, nc *nats.Conn, id, model, path string, maxTokens int) *frames {
	t.Helper()
	f := &frames{}
	inbox := nats.NewInbox()
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		fr, err := schemas.ParseFrame(m.Data)
		if err != nil {
			t.Errorf("bad frame %q", m.Data)
			return
		}
		fr.Payload = append([]byte(nil), fr.Payload...)
		if fr.Type.Terminal() {
			endTimes.Store(id, time.Now())
		}
		f.mu.Lock()
		f.got = append(f.got, fr)
		f.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, id)
	h.Set(schemas.HdrKind, "chat")
	h.Set(schemas.HdrModel, model)
	if path != "" {
		h.Set(schemas.HdrAdapterBase, "b")
		h.Set(schemas.HdrAdapterPath, path)
	}
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, model, maxTokens)
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.WorkSubject("w1"), Reply: inbox, Header: h, Data: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	return f
}

// endTimes records when each request ask sent got its terminal frame, by id.
var endTimes sync.Map

func endTime(id string) time.Time {
	v, _ := endTimes.Load(id)
	t, _ := v.(time.Time)
	return t
}

// ended waits for f's terminal frame and returns it.
func ended(t *testing.T, f *frames) schemas.Frame {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !f.last().Type.Terminal() {
			return fmt.Errorf("not ended: %v", f.types())
		}
		return nil
	})
	return f.last()
}

func wantDone(t *testing.T, f *frames) {
	t.Helper()
	if last := ended(t, f); last.Type != schemas.FrameDone {
		t.Fatalf("ended with %s %s", last.Type, last.Payload)
	}
	// The chunks came from the engine, all of them: at least one, and the
	// stream's finish among them.
	f.mu.Lock()
	defer f.mu.Unlock()
	chunks, finishes := 0, 0
	for _, fr := range f.got {
		if fr.Type != schemas.FrameChunk {
			continue
		}
		chunks++
		if !strings.Contains(string(fr.Payload), `"model":`) {
			t.Fatalf("chunk %s", fr.Payload)
		}
		finishes += strings.Count(string(fr.Payload), `"finish_reason":"`)
	}
	if chunks == 0 || finishes != 1 {
		t.Fatalf("%d chunk frames with %d finishes: %v", chunks, finishes, f.types())
	}
}

// beats records worker w1's heartbeats.
type beats struct {
	mu  sync.Mutex
	all []schemas.Heartbeat
}

func watchBeats(t *testing.T, nc *nats.Conn) *beats {
	b := &beats{}
	if _, err := nc.Subscribe(schemas.HeartbeatSubject("w1"), func(m *nats.Msg) {
		var hb schemas.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			b.mu.Lock()
			b.all = append(b.all, hb)
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	return b
}

// snapshot copies the heartbeats so far.
func (b *beats) snapshot() []schemas.Heartbeat {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.all)
}

func (b *beats) seen(f func(schemas.Heartbeat) bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.ContainsFunc(b.all, f)
}

func TestAdapterLoadedOnDemandOnce(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := simEngine(t, 2, 20*time.Millisecond, 0)
	hbs := watchBeats(t, nc)
	// A long heartbeat interval: any beat listing the adapter is the early one.
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", HeartbeatInterval: time.Hour})
	wantDone(t, ask(t, nc, "r1", "x", "sim://x", 4))
	if s := w.AdapterStats(); s.Loads != 1 {
		t.Fatalf("first request: %+v, want one load", s)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if !hbs.seen(func(h schemas.Heartbeat) bool { return slices.Contains(h.Loading, "x") }) ||
			!hbs.seen(func(h schemas.Heartbeat) bool {
				return slices.Equal(h.Adapters, []string{"x"}) && slices.Contains(h.Models, "x")
			}) {
			return fmt.Errorf("no early heartbeats for the load: %+v", hbs.snapshot())
		}
		return nil
	})
	// The second request for it does not load it again, nor one without a path.
	wantDone(t, ask(t, nc, "r2", "x", "sim://x", 4))
	wantDone(t, ask(t, nc, "r3", "x", "", 4))
	// The base model needs nothing.
	wantDone(t, ask(t, nc, "r4", "b", "", 4))
	if s := w.AdapterStats(); s.Loads != 1 || s.Evictions != 0 {
		t.Fatalf("after more requests: %+v, want still one load", s)
	}
	// An adapter nobody gave a path for is the engine's 404.
	last := ended(t, ask(t, nc, "r5", "unknown", "", 4))
	if e := schemas.ParseErrorPayload(last.Payload); last.Type != schemas.FrameError || e.Status != 404 {
		t.Fatalf("unknown model: %s %s", last.Type, last.Payload)
	}
}

func TestAdapterConcurrentFirstRequestsLoadOnce(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := simEngine(t, 2, 150*time.Millisecond, 0)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1"})
	var fs []*frames
	for i := range 8 {
		fs = append(fs, ask(t, nc, fmt.Sprintf("c%d", i), "x", "sim://x", 4))
	}
	for _, f := range fs {
		wantDone(t, f)
	}
	if s := w.AdapterStats(); s.Loads != 1 || s.LoadFailures != 0 {
		t.Fatalf("%+v: want exactly one load for 8 concurrent first requests", s)
	}
}

// The worker evicts the adapter asked for least (decayed request rate),
// not the least recently used.
func TestAdapterEvictsColdest(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := simEngine(t, 2, 5*time.Millisecond, 0)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1"})
	for i, m := range []string{"x", "y", "x"} { // y is asked for least
		wantDone(t, ask(t, nc, fmt.Sprintf("r%d", i), m, "sim://"+m, 2))
	}
	wantDone(t, ask(t, nc, "rz", "z", "sim://z", 2))
	if got := eng.Stats().Adapters; !slices.Equal(got, []string{"x", "z"}) {
		t.Fatalf("adapters %v, want [x z]: y was asked for least", got)
	}
	if s := w.AdapterStats(); s.Loads != 3 || s.Evictions != 1 {
		t.Fatalf("%+v", s)
	}
	// y comes back, evicting z (asked for once; x twice), though x was
	// used less recently.
	wantDone(t, ask(t, nc, "ry", "y", "sim://y", 2))
	if got := eng.Stats().Adapters; !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("adapters %v, want [x y]", got)
	}
}

// With one slot, held by an adapter a request is running on, a request for
// another adapter waits for it rather than pull the adapter from under it.
func TestAdapterNotEvictedWhileInUse(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &recordingEngine{Engine: simEngine(t, 1, 5*time.Millisecond, 2*time.Millisecond), at: map[string]time.Time{}}
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1"})
	long := ask(t, nc, "inuse-long", "x", "sim://x", 150) // about 300ms of decoding
	testenv.WaitFor(t, 2*time.Second, func() error {
		if !slices.Contains(long.types(), schemas.FrameChunk) {
			return fmt.Errorf("x not streaming yet")
		}
		return nil
	})
	other := ask(t, nc, "inuse-other", "y", "sim://y", 2)
	wantDone(t, long)
	wantDone(t, other)
	if !endTime("inuse-other").After(endTime("inuse-long")) {
		t.Fatalf("y's request ended before x's")
	}
	// x was unloaded only once the request on it was over.
	if gen, unload := eng.time("generated x"), eng.time("unloaded x"); unload.IsZero() || !unload.After(gen) {
		t.Fatalf("x unloaded at %v, its request ended at %v", unload, gen)
	}
	if s := w.AdapterStats(); s.Loads != 2 || s.Evictions != 1 {
		t.Fatalf("%+v", s)
	}
}

// recordingEngine is the sim engine noting when each request on a model
// ended and when each adapter was unloaded.
type recordingEngine struct {
	*sim.Engine
	mu sync.Mutex
	at map[string]time.Time
}

func (e *recordingEngine) note(what string) {
	e.mu.Lock()
	e.at[what] = time.Now()
	e.mu.Unlock()
}

func (e *recordingEngine) time(what string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.at[what]
}

func (e *recordingEngine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	defer e.note("generated " + req.Model)
	return e.Engine.Generate(ctx, req, sink)
}

func (e *recordingEngine) UnloadAdapter(ctx context.Context, name string) error {
	e.note("unloaded " + name)
	return e.Engine.UnloadAdapter(ctx, name)
}

// failingEngine is the sim engine whose adapter loads from paths starting
// with "bad:" fail after a while, as a load of weights that do not exist does.
type failingEngine struct {
	*sim.Engine
}

func (e failingEngine) LoadAdapter(ctx context.Context, name, path string) error {
	if strings.HasPrefix(path, "bad:") {
		time.Sleep(100 * time.Millisecond)
		return schemas.FromUpstream(400, schemas.TypeInvalidRequest, "", "lora_path", fmt.Sprintf("No adapter found for %s", path))
	}
	return e.Engine.LoadAdapter(ctx, name, path)
}

func TestAdapterLoadFailure(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := failingEngine{simEngine(t, 2, 5*time.Millisecond, 0)}
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1"})
	var fs []*frames
	for i := range 3 {
		fs = append(fs, ask(t, nc, fmt.Sprintf("f%d", i), "x", "bad:/nowhere", 2))
	}
	for _, f := range fs {
		last := ended(t, f)
		e := schemas.ParseErrorPayload(last.Payload)
		if last.Type != schemas.FrameError || e.Status != 500 || e.Body.Code == nil || *e.Body.Code != schemas.CodeAdapterLoadFailed ||
			!strings.Contains(e.Body.Message, "`x`") || !strings.Contains(e.Body.Message, "bad:/nowhere") ||
			!strings.Contains(e.Body.Message, "No adapter found") {
			t.Fatalf("ended with %s %s", last.Type, last.Payload)
		}
	}
	if s := w.AdapterStats(); s.LoadFailures != 1 || s.Loads != 0 {
		t.Fatalf("%+v: three concurrent requests should share one failed load", s)
	}
	// The worker goes on: the same adapter from a good path loads.
	wantDone(t, ask(t, nc, "good", "x", "sim://x", 2))
	// An adapter registered without a path (base set, path empty) is a clear error too.
	h := map[string]string{schemas.HdrModel: "nopath", schemas.HdrAdapterBase: "b"}
	f := send(t, nc, schemas.WorkSubject("w1"), "nopath", h)
	last := ended(t, f)
	if e := schemas.ParseErrorPayload(last.Payload); last.Type != schemas.FrameError || e.Body.Code == nil ||
		*e.Body.Code != schemas.CodeAdapterLoadFailed || !strings.Contains(e.Body.Message, "no path") {
		t.Fatalf("adapter without a path: %s %s", last.Type, last.Payload)
	}

	// An engine that cannot load adapters at all answers clearly too.
	ns2 := testenv.NATS(t)
	nc2 := testenv.Connect(t, ns2)
	startWorker(t, nc2, &gateEngine{release: make(chan struct{})}, Config{ID: "w1"})
	last = ended(t, ask(t, nc2, "g", "x", "sim://x", 2))
	if e := schemas.ParseErrorPayload(last.Payload); last.Type != schemas.FrameError || e.Body.Code == nil || *e.Body.Code != schemas.CodeAdapterLoadFailed {
		t.Fatalf("gate engine: %s %s", last.Type, last.Payload)
	}
}

func ctl(t *testing.T, nc *nats.Conn, op string, req schemas.AdapterRequest) schemas.CtlReply {
	t.Helper()
	b, _ := json.Marshal(req)
	m, err := nc.Request(schemas.CtlSubject("w1", op), b, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r schemas.CtlReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAdapterControlGoesThroughManager(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := simEngine(t, 1, 5*time.Millisecond, 2*time.Millisecond)
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", AdapterUnloadGrace: 3 * time.Second})
	if r := ctl(t, nc, schemas.CtlLoadAdapter, schemas.AdapterRequest{Name: "x", Base: "b", Path: "sim://x"}); !r.OK {
		t.Fatalf("load: %+v", r.Error)
	}
	// Loading it again is no error and no load; a request uses it as is.
	if r := ctl(t, nc, schemas.CtlLoadAdapter, schemas.AdapterRequest{Name: "x", Base: "b", Path: "sim://x"}); !r.OK {
		t.Fatalf("second load: %+v", r.Error)
	}
	wantDone(t, ask(t, nc, "r1", "x", "sim://x", 2))
	// The one slot is full: a control load evicts x.
	if r := ctl(t, nc, schemas.CtlLoadAdapter, schemas.AdapterRequest{Name: "y", Path: "sim://y"}); !r.OK {
		t.Fatalf("load y: %+v", r.Error)
	}
	if s := w.AdapterStats(); s.Loads != 2 || s.Evictions != 1 {
		t.Fatalf("%+v", s)
	}
	// Unload (the registry dropped y) waits for the request running on it.
	long := ask(t, nc, "long", "y", "sim://y", 100)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if !slices.Contains(long.types(), schemas.FrameChunk) {
			return fmt.Errorf("not streaming yet")
		}
		return nil
	})
	if r := ctl(t, nc, schemas.CtlUnloadAdapter, schemas.AdapterRequest{Name: "y"}); !r.OK {
		t.Fatalf("unload: %+v", r.Error)
	}
	// The request ran to its end (done, not an error) although y was unloaded.
	testenv.WaitFor(t, time.Second, func() error {
		if last := long.last(); last.Type != schemas.FrameDone {
			return fmt.Errorf("the request on y ended with %v", long.types())
		}
		return nil
	})
	if got := eng.Stats().Adapters; len(got) != 0 {
		t.Fatalf("adapters after unload: %v", got)
	}
	// Unloading what is not loaded is a success (it may have been evicted).
	if r := ctl(t, nc, schemas.CtlUnloadAdapter, schemas.AdapterRequest{Name: "y"}); !r.OK {
		t.Fatalf("second unload: %+v", r.Error)
	}
	if s := w.AdapterStats(); s.Unloads != 1 {
		t.Fatalf("%+v", s)
	}
	// Without a path a control load is refused.
	if r := ctl(t, nc, schemas.CtlLoadAdapter, schemas.AdapterRequest{Name: "z"}); r.OK || r.Error.Status != 400 {
		t.Fatalf("load without path: %+v", r)
	}
}

// A request's adapter is no longer in use by the time the request's end
// goes out: a client that sends its next request as soon as it has it finds
// the adapter free to evict (else a load there would evict a hotter one).
// The frames are handed over in memory, so the check runs as the end is
// sent, not after a trip through NATS.
func TestAdapterReleasedBeforeTheEnd(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	type end struct {
		frame schemas.FrameType
		inUse []string
	}
	ends := make(chan end, 1)
	var wp atomic.Pointer[Worker]
	local := &receiver{prefix: "_INBOX.gw.", got: map[string][]schemas.Frame{},
		onFrame: func(_ string, f schemas.Frame) {
			if f.Type.Terminal() {
				ends <- end{f.Type, wp.Load().adapters.InUse()}
			}
		}}
	w, _, _ := startWorker(t, nc, simEngine(t, 2, 0, 0), Config{ID: "w1", Local: local})
	wp.Store(w)
	m := workMsg("r1", "_INBOX.gw.r1", map[string]string{schemas.HdrModel: "x", schemas.HdrAdapterBase: "b", schemas.HdrAdapterPath: "sim://x"})
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-ends:
		if e.frame != schemas.FrameDone {
			t.Fatalf("ended with %s", e.frame)
		}
		if len(e.inUse) != 0 {
			t.Fatalf("adapters %v still in use as the request's end went out", e.inUse)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no end")
	}
}
