package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// knownModels is a registry of base models only: nothing is an adapter.
type knownModels map[string]bool

func (k knownModels) Known(m string) bool { return k[m] }
func (k knownModels) Get(m string) (registry.Model, bool) {
	return registry.Model{Name: m}, k[m]
}
func (k knownModels) Models() []registry.Model {
	var out []registry.Model
	for m, ok := range k {
		if ok {
			out = append(out, registry.Model{Name: m})
		}
	}
	return out
}

// fakeWorker is a heartbeat and a work subscription on a real NATS server.
type fakeWorker struct {
	id  string
	nc  *nats.Conn
	mu  sync.Mutex
	got []*nats.Msg
}

func newFakeWorker(t *testing.T, nc *nats.Conn, id string, max int) *fakeWorker {
	w := &fakeWorker{id: id, nc: nc}
	if _, err := nc.Subscribe(schemas.WorkSubject(id), func(m *nats.Msg) {
		w.mu.Lock()
		w.got = append(w.got, m)
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	w.beat(t, 0, max)
	return w
}

func (w *fakeWorker) beat(t *testing.T, running, max int) {
	b, _ := json.Marshal(schemas.Heartbeat{Worker: w.id, Models: []string{"m"}, MaxConcurrency: max, Running: running, Healthy: true, IntervalMS: 1000})
	if err := w.nc.Publish(schemas.HeartbeatSubject(w.id), b); err != nil {
		t.Fatal(err)
	}
}

func (w *fakeWorker) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

func (w *fakeWorker) done(t *testing.T, running int) {
	b, _ := json.Marshal(schemas.DoneNotice{Worker: w.id, RequestID: "x", Running: running})
	w.nc.Publish(schemas.DoneSubject(w.id), b)
}

type replies struct {
	mu     sync.Mutex
	frames []schemas.Frame
}

func (r *replies) last() (schemas.Frame, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.frames) == 0 {
		return schemas.Frame{}, 0
	}
	return r.frames[len(r.frames)-1], len(r.frames)
}

func sendRequest(t *testing.T, nc *nats.Conn, model, id string) *replies {
	return sendBody(t, nc, model, id, `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
}

// sendBody publishes a chat request with body on model's request subject
// and records the frames that come back.
func sendBody(t *testing.T, nc *nats.Conn, model, id, body string) *replies {
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
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject(model), Reply: inbox, Header: h, Data: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	return r
}

func startDispatcher(t *testing.T, nc *nats.Conn, cfg Config) *Dispatcher {
	d := New(cfg, nc, knownModels{"m": true, "known-idle": true}, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

func wantCount(w *fakeWorker, n int) func() error {
	return func() error {
		if c := w.count(); c != n {
			return fmt.Errorf("worker %s got %d requests, want %d", w.id, c, n)
		}
		return nil
	}
}

func wantError(r *replies, status int, code string) func() error {
	return func() error {
		f, _ := r.last()
		if f.Type != schemas.FrameError {
			return fmt.Errorf("last frame %q", f.Type)
		}
		e := schemas.ParseErrorPayload(f.Payload)
		if e.Status != status || code != "" && (e.Body.Code == nil || *e.Body.Code != code) {
			return fmt.Errorf("error %+v", e)
		}
		return nil
	}
}

func TestRouteQueueDrain(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{QueueSize: 2, QueueTimeout: 500 * time.Millisecond})
	a := newFakeWorker(t, nc, "a", 1)
	b := newFakeWorker(t, nc, "b", 1)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 2 {
			return fmt.Errorf("workers not seen")
		}
		return nil
	})
	sendRequest(t, nc, "m", "r1")
	sendRequest(t, nc, "m", "r2")
	testenv.WaitFor(t, 2*time.Second, func() error {
		if a.count() != 1 || b.count() != 1 {
			return fmt.Errorf("a %d b %d: least-loaded should spread one each", a.count(), b.count())
		}
		return nil
	})
	// The forwarded message keeps the client's reply subject and names where to bounce.
	a.mu.Lock()
	fwd := a.got[0]
	a.mu.Unlock()
	if fwd.Header.Get(schemas.HdrBounce) != schemas.BounceSubject(d.ID()) || fwd.Reply == "" {
		t.Fatalf("forwarded headers %v reply %q", fwd.Header, fwd.Reply)
	}
	// Both full: the next two queue, the one after is refused.
	q1 := sendRequest(t, nc, "m", "r3")
	q2 := sendRequest(t, nc, "m", "r4")
	testenv.WaitFor(t, 2*time.Second, func() error {
		if f, _ := q2.last(); f.Type != schemas.FrameQueued {
			return fmt.Errorf("r4 not queued")
		}
		return nil
	})
	full := sendRequest(t, nc, "m", "r5")
	testenv.WaitFor(t, 2*time.Second, wantError(full, 503, schemas.CodeQueueFull))
	// A queued request cancelled by its client is dropped: with the cancel
	// token of its queued frame, not by its id alone or with another token.
	testenv.WaitFor(t, 2*time.Second, func() error {
		if f, _ := q1.last(); f.Type != schemas.FrameQueued {
			return fmt.Errorf("r3 not queued")
		}
		return nil
	})
	f, _ := q1.last()
	var qd schemas.Queued
	if err := json.Unmarshal(f.Payload, &qd); err != nil || len(qd.CancelToken) != 2*schemas.CancelTokenBytes {
		t.Fatalf("queued frame %s: no cancel token (%v)", f.Payload, err)
	}
	queuedNow := func() int {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.byID)
	}
	nc.Publish(schemas.QueueCancel, []byte("r3"))
	nc.Publish(schemas.QueueCancel, schemas.CancelBody("r3", schemas.NewCancelToken()))
	nc.Flush()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := counterValue(d.m.cancelsIgnored); n != 2 {
			return fmt.Errorf("%v cancels ignored, want 2", n)
		}
		return nil
	})
	if n := queuedNow(); n != 2 {
		t.Fatalf("a cancel without the token dropped a request: %d queued", n)
	}
	nc.Publish(schemas.QueueCancel, schemas.CancelBody("r3", qd.CancelToken))
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := queuedNow(); n != 1 {
			return fmt.Errorf("%d queued, want 1 (r3 cancelled)", n)
		}
		return nil
	})
	// ...so when a frees a slot, r4 goes there.
	a.done(t, 0)
	testenv.WaitFor(t, 2*time.Second, wantCount(a, 2))
	a.mu.Lock()
	got := a.got[1].Header.Get(schemas.HdrRequestID)
	a.mu.Unlock()
	if got != "r4" {
		t.Fatalf("drained %s, want r4 (r3 was cancelled)", got)
	}
	if _, n := q1.last(); n != 1 {
		t.Fatalf("cancelled r3 got %d frames", n)
	}
	// A request that waits past the queue timeout gets a 503.
	late := sendRequest(t, nc, "m", "r6")
	testenv.WaitFor(t, 3*time.Second, wantError(late, 503, ""))
}

func TestUnknownAndIdleModels(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	startDispatcher(t, nc, Config{ColdStartTimeout: time.Second})
	tests := []struct {
		model  string
		status int
		code   string
	}{
		// A fresh dispatcher waits out its warm-up before refusing.
		{"never-heard-of", 404, "model_not_found"},
		// A registered model with no worker waits for one (hold.go) up to
		// the cold-start timeout.
		{"known-idle", 503, "cold_start_timeout"},
	}
	for _, tt := range tests {
		r := sendRequest(t, nc, tt.model, "r-"+tt.model)
		testenv.WaitFor(t, warmUp+2*time.Second, wantError(r, tt.status, tt.code))
	}
}

func TestBounceGoesElsewhere(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{})
	a := newFakeWorker(t, nc, "a", 4)
	b := newFakeWorker(t, nc, "b", 4)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 2 {
			return fmt.Errorf("workers not seen")
		}
		return nil
	})
	sendRequest(t, nc, "m", "r1")
	var first, other *fakeWorker
	testenv.WaitFor(t, 2*time.Second, func() error {
		switch {
		case a.count() == 1:
			first, other = a, b
		case b.count() == 1:
			first, other = b, a
		default:
			return fmt.Errorf("not routed")
		}
		return nil
	})
	// The chosen worker is full after all: it bounces the request back.
	first.mu.Lock()
	m := first.got[0]
	first.mu.Unlock()
	nc.PublishMsg(&nats.Msg{Subject: m.Header.Get(schemas.HdrBounce), Reply: m.Reply, Header: m.Header, Data: m.Data})
	testenv.WaitFor(t, 2*time.Second, wantCount(other, 1))
	other.mu.Lock()
	attempt := other.got[0].Header.Get(schemas.HdrAttempt)
	other.mu.Unlock()
	if attempt != "1" {
		t.Fatalf("attempt header %q", attempt)
	}
}

func TestReplySubjectMustBeAnInbox(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{})
	w := newFakeWorker(t, nc, "w", 4)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 1 {
			return fmt.Errorf("worker not seen")
		}
		return nil
	})
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, "evil")
	h.Set(schemas.HdrKind, "chat")
	// A reply subject aimed at a worker's control subject must not be used.
	nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("m"), Reply: schemas.CtlSubject("w", schemas.CtlDrain), Header: h, Data: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	// Nor one that comes back as a bounce (worker credentials may publish there).
	h.Set(schemas.HdrModel, "m")
	nc.PublishMsg(&nats.Msg{Subject: schemas.BounceSubject(d.cfg.ID), Reply: schemas.CtlSubject("w", schemas.CtlDrain), Header: h, Data: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	sendRequest(t, nc, "m", "good")
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	w.mu.Lock()
	defer w.mu.Unlock()
	if id := w.got[0].Header.Get(schemas.HdrRequestID); id != "good" {
		t.Fatalf("forwarded %q", id)
	}
}

// A NATS-native request's body is read here, with the one reader: a bad body
// is a 400 that reaches no worker, and the body's priority is used when the
// request has no Tb-Priority header.
func TestNATSNativeBodyIsRead(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	startDispatcher(t, nc, Config{})
	w := newFakeWorker(t, nc, "w", 10)
	send := func(id, body string) *replies { return sendBody(t, nc, "m", id, body) }
	for _, tc := range []struct{ name, body, param string }{
		{"no messages", `{"model":"m"}`, "messages"},
		{"repeated max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_tokens":300}`, "max_tokens"},
		{"not JSON", `{"model":`, ""},
	} {
		r := send("bad-"+tc.param, tc.body)
		testenv.WaitFor(t, 2*time.Second, func() error {
			if err := wantError(r, 400, "")(); err != nil {
				return fmt.Errorf("%s: %v", tc.name, err)
			}
			f, _ := r.last()
			if e := schemas.ParseErrorPayload(f.Payload); tc.param != "" && (e.Body.Param == nil || *e.Body.Param != tc.param) {
				return fmt.Errorf("%s: param %v", tc.name, e.Body.Param)
			}
			return nil
		})
	}
	send("good", `{"model":"m","messages":[{"role":"user","content":"hi"}],"priority":-3}`)
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.got[0].Header.Get(schemas.HdrPriority); p != "-3" {
		t.Fatalf("forwarded with priority %q, want the body's -3", p)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// A request sent again by its client after a worker failed it names the
// workers to avoid (Tb-Exclude): the dispatcher routes it to another, here
// the only one left, although the excluded ones are less loaded. (Exclusion
// holds when a request is routed; one that has to queue goes to whichever
// worker frees a slot first, as a bounced one does.)
func TestClientExclude(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{})
	ws := map[string]*fakeWorker{}
	for _, id := range []string{"a", "b", "c"} {
		ws[id] = newFakeWorker(t, nc, id, 4)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 3 {
			return fmt.Errorf("workers not seen")
		}
		return nil
	})
	for i := range 4 {
		h := nats.Header{}
		h.Set(schemas.HdrRequestID, fmt.Sprintf("r%d", i))
		h.Set(schemas.HdrKind, "chat")
		h.Set(schemas.HdrExclude, "a,c")
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		if err := nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("m"), Reply: nats.NewInbox(), Header: h, Data: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 2*time.Second, wantCount(ws["b"], 4)) // b's four slots
	if ws["a"].count() != 0 || ws["c"].count() != 0 {
		t.Fatalf("excluded workers got %d and %d requests", ws["a"].count(), ws["c"].count())
	}
}

func TestExcludeHas(t *testing.T) {
	for _, tc := range []struct {
		list, id string
		want     bool
	}{
		{"", "a", false}, {"a", "a", true}, {"a,b", "b", true}, {"ab,b", "a", false}, {"a,,b", "", false}, {"w-1,w-2", "w-2", true},
	} {
		if got := schemas.ExcludeHas(tc.list, tc.id); got != tc.want {
			t.Errorf("ExcludeHas(%q, %q) = %v", tc.list, tc.id, got)
		}
	}
}

// takeLocal is a LocalWorkers holding some workers in memory: it records
// what it takes.
type takeLocal struct {
	ids map[string]bool
	mu  sync.Mutex
	got []*nats.Msg
}

func (l *takeLocal) Take(worker string, m *nats.Msg) bool {
	if !l.ids[worker] {
		return false
	}
	l.mu.Lock()
	l.got = append(l.got, m)
	l.mu.Unlock()
	return true
}

func (l *takeLocal) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.got)
}

// A request for a worker in this process is handed to it in memory, with
// the headers the bus would carry and nothing on the worker's subject; one
// for a worker that is not goes on the bus.
func TestLocalWorkers(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	local := &takeLocal{ids: map[string]bool{"near": true}}
	startDispatcher(t, nc, Config{Local: local})
	near := newFakeWorker(t, nc, "near", 1)
	sendRequest(t, nc, "m", "r1")
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := local.count(); n != 1 {
			return fmt.Errorf("%d requests taken in memory", n)
		}
		return nil
	})
	local.mu.Lock()
	m := local.got[0]
	local.mu.Unlock()
	if m.Subject != schemas.WorkSubject("near") || m.Header.Get(schemas.HdrRequestID) != "r1" ||
		m.Header.Get(schemas.HdrWorker) != "near" || m.Header.Get(schemas.HdrCancelToken) == "" || !strings.HasPrefix(m.Reply, "_INBOX.") {
		t.Fatalf("taken: subject %q reply %q header %v", m.Subject, m.Reply, m.Header)
	}
	near.beat(t, 1, 1) // full: the next request goes to the other worker, on the bus
	far := newFakeWorker(t, nc, "far", 1)
	sendRequest(t, nc, "m", "r2")
	testenv.WaitFor(t, 2*time.Second, wantCount(far, 1))
	if n := near.count(); n != 0 {
		t.Fatalf("the worker in memory got %d requests on the bus too", n)
	}
	if n := local.count(); n != 1 {
		t.Fatalf("%d requests taken in memory, want only r1", n)
	}
}
