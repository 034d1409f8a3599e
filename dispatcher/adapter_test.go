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

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// fakeRegistry is a Registry with adapters, as registry.Cache may be.
type fakeRegistry map[string]registry.Model

func (r fakeRegistry) Known(m string) bool { _, ok := r[m]; return ok }
func (r fakeRegistry) Get(m string) (registry.Model, bool) {
	x, ok := r[m]
	return x, ok
}
func (r fakeRegistry) Models() []registry.Model {
	var out []registry.Model
	for _, m := range r {
		out = append(out, m)
	}
	return out
}

var loraRegistry = fakeRegistry{
	"b":      {Name: "b"},
	"x":      {Name: "x", Base: "b", Path: "/loras/x"},
	"y":      {Name: "y", Base: "b", Path: "/loras/y"},
	"z":      {Name: "z", Base: "b", Path: "/loras/z"},
	"orphan": {Name: "orphan", Base: "gone", Path: "/loras/orphan"},
	// A registered base that no worker serves, and its adapter.
	"idle":      {Name: "idle"},
	"idle-lora": {Name: "idle-lora", Base: "idle", Path: "/loras/idle"},
}

func startAdapterDispatcher(t *testing.T, nc *nats.Conn) *Dispatcher {
	t.Helper()
	d := New(Config{ColdStartTimeout: time.Second}, nc, loraRegistry, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// loraWorker is a fake worker of base model "b" with LoRA slots.
func loraWorker(t *testing.T, nc *nats.Conn, id string, max, maxLoras int, adapters ...string) *fakeWorker {
	t.Helper()
	w := &fakeWorker{id: id, nc: nc}
	if _, err := nc.Subscribe(schemas.WorkSubject(id), func(m *nats.Msg) {
		w.mu.Lock()
		w.got = append(w.got, m)
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	b, _ := json.Marshal(schemas.Heartbeat{Worker: id, Models: append([]string{"b"}, adapters...), Adapters: adapters,
		MaxLoras: maxLoras, MaxConcurrency: max, Healthy: true, IntervalMS: 1000})
	if err := nc.Publish(schemas.HeartbeatSubject(id), b); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *fakeWorker) msgs() []*nats.Msg {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*nats.Msg(nil), w.got...)
}

func waitWorkers(t *testing.T, d *Dispatcher, n int) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if got := d.Fleet().Serving("b"); got != n {
			return fmt.Errorf("%d workers seen, want %d", got, n)
		}
		return nil
	})
}

func TestAdapterRoutingPrefersHolder(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startAdapterDispatcher(t, nc)
	holder := loraWorker(t, nc, "holder", 10, 4, "x")
	other := loraWorker(t, nc, "other", 10, 4)
	waitWorkers(t, d, 2)
	for i := range 3 {
		sendRequest(t, nc, "x", fmt.Sprintf("r%d", i))
	}
	testenv.WaitFor(t, 2*time.Second, wantCount(holder, 3))
	if other.count() != 0 {
		t.Fatalf("the worker without the adapter got %d requests", other.count())
	}
	for _, m := range holder.msgs() {
		if m.Header.Get(schemas.HdrAdapterBase) != "b" || m.Header.Get(schemas.HdrAdapterPath) != "/loras/x" ||
			m.Header.Get(schemas.HdrModel) != "x" {
			t.Fatalf("forwarded headers %v", m.Header)
		}
	}
	if p := d.Fleet().Pending("x"); len(p) != 0 {
		t.Fatalf("a load is pending for an adapter already loaded: %v", p)
	}
	// A client cannot make a worker load weights of its choosing: the
	// adapter headers of a request for a base model are removed.
	inbox := nats.NewInbox()
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, "sneaky")
	h.Set(schemas.HdrKind, "chat")
	h.Set(schemas.HdrAdapterPath, "/etc/evil")
	h.Set(schemas.HdrAdapterBase, "b")
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("b"), Reply: inbox, Header: h, Data: []byte(`{"model":"b","messages":[{"role":"user","content":"hi"}]}`)}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if holder.count()+other.count() != 4 {
			return fmt.Errorf("base request not routed")
		}
		return nil
	})
	for _, w := range []*fakeWorker{holder, other} {
		for _, m := range w.msgs() {
			if m.Header.Get(schemas.HdrRequestID) == "sneaky" && (m.Header.Get(schemas.HdrAdapterPath) != "" || m.Header.Get(schemas.HdrAdapterBase) != "") {
				t.Fatalf("client's adapter headers forwarded: %v", m.Header)
			}
		}
	}
}

// Many first requests for an adapter no worker has, at once: all go to the
// one worker that got the first, which loads it once.
func TestAdapterFirstRequestsCoalesce(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startAdapterDispatcher(t, nc)
	ws := []*fakeWorker{loraWorker(t, nc, "w1", 100, 4), loraWorker(t, nc, "w2", 100, 4), loraWorker(t, nc, "w3", 100, 4)}
	waitWorkers(t, d, 3)
	const n = 12
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); sendRequest(t, nc, "x", fmt.Sprintf("c%d", i)) }()
	}
	wg.Wait()
	testenv.WaitFor(t, 2*time.Second, func() error {
		total := 0
		for _, w := range ws {
			total += w.count()
		}
		if total != n {
			return fmt.Errorf("%d of %d routed", total, n)
		}
		return nil
	})
	var got []string
	for _, w := range ws {
		if w.count() > 0 {
			got = append(got, fmt.Sprintf("%s:%d", w.id, w.count()))
		}
	}
	if len(got) != 1 {
		t.Fatalf("first requests spread over workers %v: each would load the adapter", got)
	}
	if p := d.Fleet().Pending("x"); len(p) != 1 || !strings.HasPrefix(got[0], p[0]+":") {
		t.Fatalf("pending %v, routed %v", p, got)
	}
}

func TestAdapterWithoutBaseWorker(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startAdapterDispatcher(t, nc)
	loraWorker(t, nc, "w1", 10, 4)
	waitWorkers(t, d, 1)
	r := sendRequest(t, nc, "orphan", "o1")
	// An adapter whose base is not registered cannot be held for (its base
	// may never come up): a dispatcher that has just started queues it for
	// warmUp (it may not have heard every heartbeat yet), then refuses it.
	testenv.WaitFor(t, warmUp+2*time.Second, wantError(r, 503, schemas.CodeNoWorker))
	f, _ := r.last()
	if e := schemas.ParseErrorPayload(f.Payload); !strings.Contains(e.Body.Message, "`gone`") {
		t.Fatalf("the error does not name the missing base model: %s", e.Body.Message)
	}
	// An adapter of a registered base with no worker is held for one
	// (hold.go), until the cold-start timeout.
	held := sendRequest(t, nc, "idle-lora", "o3")
	testenv.WaitFor(t, 3*time.Second, wantError(held, 503, "cold_start_timeout"))
	if qs := held.queuedFrames(); len(qs) == 0 || !qs[0].Cold {
		t.Fatalf("the adapter's request was not held: queued frames %+v", qs)
	}
	unknown := sendRequest(t, nc, "nope", "o2")
	testenv.WaitFor(t, 2*time.Second, wantError(unknown, 404, "model_not_found"))
}

// A request for an adapter waits in the queue while every worker of its base
// is full, and goes out (with its adapter headers) when one frees a slot.
func TestAdapterQueuedThenDrained(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startAdapterDispatcher(t, nc)
	w := loraWorker(t, nc, "w1", 1, 4)
	waitWorkers(t, d, 1)
	sendRequest(t, nc, "b", "busy")
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	q := sendRequest(t, nc, "x", "waits")
	testenv.WaitFor(t, 2*time.Second, func() error {
		if f, _ := q.last(); f.Type != schemas.FrameQueued {
			return fmt.Errorf("not queued: %q", f.Type)
		}
		return nil
	})
	w.done(t, 0)
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 2))
	m := w.msgs()[1]
	if m.Header.Get(schemas.HdrRequestID) != "waits" || m.Header.Get(schemas.HdrAdapterPath) != "/loras/x" {
		t.Fatalf("drained %v", m.Header)
	}
}

// With placement off, the dispatcher still counts requests per adapter: a
// request for an adapter no worker holds, with every slot full, goes to the
// worker whose loaded adapter is asked for least (which it would evict),
// not to the least loaded one, whose only adapter is the one in demand.
func TestAdapterEvictsOnColdestWorker(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startAdapterDispatcher(t, nc)
	hot := loraWorker(t, nc, "hot", 10, 1, "x")
	cold := &fakeWorker{id: "cold", nc: nc}
	if _, err := nc.Subscribe(schemas.WorkSubject("cold"), func(m *nats.Msg) {
		cold.mu.Lock()
		cold.got = append(cold.got, m)
		cold.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	// cold is the busier one: by load alone, the new adapter would go to hot.
	b, _ := json.Marshal(schemas.Heartbeat{Worker: "cold", Models: []string{"b", "y"}, Adapters: []string{"y"},
		MaxLoras: 1, MaxConcurrency: 10, Running: 6, Healthy: true, IntervalMS: 1000})
	if err := nc.Publish(schemas.HeartbeatSubject("cold"), b); err != nil {
		t.Fatal(err)
	}
	waitWorkers(t, d, 2)
	for i := range 3 {
		sendRequest(t, nc, "x", fmt.Sprintf("x%d", i))
	}
	testenv.WaitFor(t, 2*time.Second, wantCount(hot, 3))
	sendRequest(t, nc, "z", "z1")
	testenv.WaitFor(t, 2*time.Second, wantCount(cold, 1))
	if hot.count() != 3 {
		t.Fatalf("the worker of the adapter in demand got the load: %d requests", hot.count())
	}
	if m := cold.msgs()[0]; m.Header.Get(schemas.HdrRequestID) != "z1" || m.Header.Get(schemas.HdrAdapterPath) != "/loras/z" {
		t.Fatalf("cold got %v", m.Header)
	}
}
