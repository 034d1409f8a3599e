package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// gateEngine is a test engine whose requests block until released, so tests
// control exactly when a request finishes. The bus around it is real.
type gateEngine struct {
	release  chan struct{}
	silent   time.Duration // wait this long before the first chunk
	started  atomic.Int64
	canceled atomic.Int64
}

func (e *gateEngine) Name() string     { return "gate" }
func (e *gateEngine) Models() []string { return []string{"m"} }
func (e *gateEngine) Stats() engine.Stats {
	return engine.Stats{}
}
func (e *gateEngine) Health(context.Context) error { return nil }
func (e *gateEngine) Close() error                 { return nil }
func (e *gateEngine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	e.started.Add(1)
	if e.silent > 0 {
		select {
		case <-time.After(e.silent):
		case <-ctx.Done():
			e.canceled.Add(1)
			return nil, ctx.Err()
		}
	}
	if err := sink.Chunks([]byte(`{"n":1}`)); err != nil {
		return nil, err
	}
	select {
	case <-e.release:
	case <-ctx.Done():
		e.canceled.Add(1)
		return nil, ctx.Err()
	}
	return &engine.Result{Usage: schemas.Usage{CompletionTokens: 1}}, nil
}

func startWorker(t *testing.T, nc *nats.Conn, eng engine.Engine, cfg Config) (*Worker, context.CancelFunc, chan error) {
	t.Helper()
	return startWorkerLog(t, nc, eng, cfg, nil)
}

// startWorkerLog is startWorker with the worker's logger.
func startWorkerLog(t *testing.T, nc *nats.Conn, eng engine.Engine, cfg Config, log *slog.Logger) (*Worker, context.CancelFunc, chan error) {
	t.Helper()
	w, err := New(cfg, nc, eng, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-w.Ready()
	t.Cleanup(func() { cancel(); <-done })
	return w, cancel, done
}

// frames collects the reply stream of one request.
type frames struct {
	mu  sync.Mutex
	got []schemas.Frame
}

func (f *frames) types() []schemas.FrameType {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []schemas.FrameType
	for _, x := range f.got {
		out = append(out, x.Type)
	}
	return out
}

func (f *frames) last() schemas.Frame {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.got) == 0 {
		return schemas.Frame{}
	}
	return f.got[len(f.got)-1]
}

// collect subscribes to a new inbox and records the frames that come to it.
func collect(t *testing.T, nc *nats.Conn) (*frames, string) {
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
		f.mu.Lock()
		f.got = append(f.got, fr)
		f.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f, inbox
}

// workMsg is a streaming chat request with id for worker "w1"'s subject,
// replying to reply, with hdr's headers set besides (model "m" unless hdr
// names another).
func workMsg(id, reply string, hdr map[string]string) *nats.Msg {
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, id)
	h.Set(schemas.HdrKind, "chat")
	h.Set(schemas.HdrModel, "m")
	for k, v := range hdr {
		h.Set(k, v)
	}
	body := `{"model":"` + h.Get(schemas.HdrModel) + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	return &nats.Msg{Subject: schemas.WorkSubject("w1"), Reply: reply, Header: h, Data: []byte(body)}
}

func send(t *testing.T, nc *nats.Conn, subject, id string, hdr map[string]string) *frames {
	t.Helper()
	f, inbox := collect(t, nc)
	m := workMsg(id, inbox, hdr)
	m.Subject = subject
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	return f
}

func wantTypes(f *frames, want ...schemas.FrameType) func() error {
	return func() error {
		got := f.types()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("frames %v, want %v", got, want)
		}
		return nil
	}
}

func TestStreamAndDoneNotice(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	startWorker(t, nc, eng, Config{ID: "w1"})
	notices := make(chan schemas.DoneNotice, 1)
	nc.Subscribe(schemas.DoneSubject("w1"), func(m *nats.Msg) {
		var n schemas.DoneNotice
		json.Unmarshal(m.Data, &n)
		notices <- n
	})
	f := send(t, nc, schemas.WorkSubject("w1"), "r1", nil)
	testenv.WaitFor(t, 2*time.Second, wantTypes(f, schemas.FrameAccepted, schemas.FrameChunk))
	close(eng.release)
	testenv.WaitFor(t, 2*time.Second, wantTypes(f, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	for i, fr := range f.got {
		if fr.Seq != uint64(i+1) {
			t.Fatalf("frame %d has seq %d", i, fr.Seq)
		}
	}
	var acc schemas.Accepted
	json.Unmarshal(f.got[0].Payload, &acc)
	if acc.Worker != "w1" || acc.Cancel != schemas.CancelSubject("w1") || acc.RequestID != "r1" {
		t.Fatalf("accepted %+v", acc)
	}
	select {
	case n := <-notices:
		if n.RequestID != "r1" || n.Running != 0 {
			t.Fatalf("notice %+v", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no done notice")
	}
}

func TestCapBouncesOrRefuses(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	defer close(eng.release)
	startWorker(t, nc, eng, Config{ID: "w1", MaxConcurrency: 1})
	first := send(t, nc, schemas.WorkSubject("w1"), "r1", nil)
	testenv.WaitFor(t, 2*time.Second, wantTypes(first, schemas.FrameAccepted, schemas.FrameChunk))

	// With a bounce subject, the request goes back to its dispatcher untouched.
	bounced := make(chan *nats.Msg, 1)
	nc.Subscribe("bounce.here", func(m *nats.Msg) { bounced <- m })
	nc.Flush()
	second := send(t, nc, schemas.WorkSubject("w1"), "r2", map[string]string{schemas.HdrBounce: "bounce.here"})
	select {
	case m := <-bounced:
		if m.Header.Get(schemas.HdrRequestID) != "r2" || !strings.HasPrefix(string(m.Data), `{"model":"m"`) || m.Reply == "" {
			t.Fatalf("bounced message %+v", m)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not bounced")
	}
	if len(second.types()) != 0 {
		t.Fatalf("a bounced request must not answer the client: %v", second.types())
	}
	// Without one, the client gets a 503.
	third := send(t, nc, schemas.WorkSubject("w1"), "r3", nil)
	testenv.WaitFor(t, 2*time.Second, wantTypes(third, schemas.FrameError))
	if e := schemas.ParseErrorPayload(third.last().Payload); e.Status != 503 || *e.Body.Code != schemas.CodeWorkerBusy {
		t.Fatalf("error %+v", e)
	}
}

func TestCancelAndKeepalive(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{}), silent: 10 * time.Second}
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1", KeepaliveInterval: 100 * time.Millisecond})
	token := schemas.NewCancelToken()
	f := send(t, nc, schemas.WorkSubject("w1"), "r1", map[string]string{schemas.HdrCancelToken: token})
	testenv.WaitFor(t, 2*time.Second, wantTypes(f, schemas.FrameAccepted, schemas.FrameKeepalive, schemas.FrameKeepalive))
	f.mu.Lock()
	acc, ok := schemas.ParseAccepted(f.got[0].Payload)
	f.mu.Unlock()
	if !ok || acc.CancelToken != token {
		t.Fatalf("accepted %+v: want the request's cancel token", acc)
	}
	// Knowing the request id is not enough: a cancel without the token, or
	// with another, is ignored.
	for _, body := range [][]byte{[]byte("r1"), schemas.CancelBody("r1", ""), schemas.CancelBody("r1", schemas.NewCancelToken()), schemas.CancelBody("r1", token[1:])} {
		if err := nc.Publish(schemas.CancelSubject("w1"), body); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, time.Second, func() error {
		if n := counterValue(w.m.cancelsIgnored); n != 4 {
			return fmt.Errorf("%v cancels ignored, want 4", n)
		}
		return nil
	})
	if eng.canceled.Load() != 0 || w.Running() != 1 {
		t.Fatalf("a cancel without the token cancelled the request")
	}
	if err := nc.Publish(schemas.CancelSubject("w1"), schemas.CancelBody("r1", acc.CancelToken)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Second, func() error {
		if eng.canceled.Load() != 1 || w.Running() != 0 {
			return fmt.Errorf("canceled %d running %d", eng.canceled.Load(), w.Running())
		}
		return nil
	})
	if ty := f.last().Type; ty.Terminal() {
		t.Fatalf("a cancelled request needs no terminal frame, got %s", ty)
	}
}

func TestBadHeadersAndDeadline(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	close(eng.release)
	startWorker(t, nc, eng, Config{ID: "w1"})
	tests := []struct {
		name   string
		id     string
		hdr    map[string]string
		status int
	}{
		{"bad id", "has space", nil, 400},
		{"bad kind", "r2", map[string]string{schemas.HdrKind: "image"}, 400},
		{"deadline passed", "r3", map[string]string{schemas.HdrDeadline: schemas.FormatDeadline(time.Now().Add(-time.Second))}, 504},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := send(t, nc, schemas.WorkSubject("w1"), tt.id, tt.hdr)
			testenv.WaitFor(t, 2*time.Second, wantTypes(f, schemas.FrameError))
			if e := schemas.ParseErrorPayload(f.last().Payload); e.Status != tt.status {
				t.Fatalf("status %d, want %d", e.Status, tt.status)
			}
		})
	}
	if eng.started.Load() != 0 {
		t.Fatal("a bad request reached the engine")
	}
}

func TestDrainFinishesInflight(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	_, cancel, done := startWorker(t, nc, eng, Config{ID: "w1", DrainTimeout: 5 * time.Second})
	beats := make(chan schemas.Heartbeat, 16)
	nc.Subscribe(schemas.HeartbeatSubject("w1"), func(m *nats.Msg) {
		var hb schemas.Heartbeat
		json.Unmarshal(m.Data, &hb)
		beats <- hb
	})
	nc.Flush()
	f := send(t, nc, schemas.WorkSubject("w1"), "r1", nil)
	testenv.WaitFor(t, 2*time.Second, wantTypes(f, schemas.FrameAccepted, schemas.FrameChunk))
	cancel() // SIGTERM
	// Draining is announced at once, and the request keeps running.
	deadline := time.After(2 * time.Second)
	for draining := false; !draining; {
		select {
		case hb := <-beats:
			draining = hb.Draining && hb.Running == 1
		case <-deadline:
			t.Fatal("no draining heartbeat")
		}
	}
	select {
	case <-done:
		t.Fatal("worker exited with a request in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(eng.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		done <- nil
	case <-time.After(3 * time.Second):
		t.Fatal("worker did not exit after its last request")
	}
	testenv.WaitFor(t, time.Second, func() error {
		if f.last().Type != schemas.FrameDone {
			return fmt.Errorf("in-flight request ended with %v", f.types())
		}
		return nil
	})
}

func TestDuplicateIDRefused(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	startWorker(t, nc, eng, Config{ID: "same"})
	w2, err := New(Config{ID: "same"}, testenv.Connect(t, ns), eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("a second worker with the same id started: %v", err)
	}
}

// A client that takes multiplexed replies gets every frame of every stream,
// in order, whether alone or batched with other streams' frames.
func TestMultiplexedReplies(t *testing.T) {
	t.Run("linger 50ms", func(t *testing.T) { testMultiplexedReplies(t, 50*time.Millisecond, true) })
	// With a linger far past the waits below, only the urgent path (a
	// stream's first chunk is never held) can deliver the first chunks.
	t.Run("first chunk not held", func(t *testing.T) { testMultiplexedReplies(t, time.Minute, false) })
}

func testMultiplexedReplies(t *testing.T, linger time.Duration, finish bool) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	startWorker(t, nc, eng, Config{ID: "w1", ChunkLinger: linger})
	var mu sync.Mutex
	got := map[string][]schemas.Frame{}
	muxed := 0
	record := func(tok string, data []byte) {
		f, err := schemas.ParseFrame(data)
		if err != nil {
			t.Errorf("bad frame %q", data)
			return
		}
		f.Payload = append([]byte(nil), f.Payload...)
		got[tok] = append(got[tok], f)
	}
	if _, err := nc.Subscribe("_INBOX.gw.*", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		tok := strings.TrimPrefix(m.Subject, "_INBOX.gw.")
		if tok == schemas.MuxToken {
			muxed++
			if err := schemas.ForEachMuxEntry(m.Data, func(tok, frame []byte) { record(string(tok), frame) }); err != nil {
				t.Error(err)
			}
			return
		}
		record(tok, m.Data)
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	const streams = 5
	for i := range streams {
		h := nats.Header{}
		h.Set(schemas.HdrRequestID, fmt.Sprintf("r%d", i))
		h.Set(schemas.HdrKind, "chat")
		h.Set(schemas.HdrModel, "m")
		h.Set(schemas.HdrMux, "1")
		nc.PublishMsg(&nats.Msg{Subject: schemas.WorkSubject("w1"), Reply: fmt.Sprintf("_INBOX.gw.s%d", i), Header: h, Data: []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)})
	}
	testenv.WaitFor(t, 3*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for i := range streams {
			if len(got[fmt.Sprintf("s%d", i)]) < 2 {
				return fmt.Errorf("stream %d: %d frames", i, len(got[fmt.Sprintf("s%d", i)]))
			}
		}
		return nil
	})
	if !finish {
		close(eng.release)
		return
	}
	close(eng.release)
	testenv.WaitFor(t, 3*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for i := range streams {
			fs := got[fmt.Sprintf("s%d", i)]
			if len(fs) != 3 || fs[2].Type != schemas.FrameDone {
				return fmt.Errorf("stream %d: %d frames", i, len(fs))
			}
			for j, f := range fs {
				if f.Seq != uint64(j+1) {
					return fmt.Errorf("stream %d frame %d has seq %d", i, j, f.Seq)
				}
			}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if muxed == 0 {
		t.Fatal("five streams finishing together never shared a message")
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// A request sent again with its id and a new cancel token (a client's
// retry or migration, which may reach this worker while the first attempt
// still runs) is a second request, not a duplicate; the same id and token
// twice is a duplicate. A cancel stops only the attempt whose token it has.
func TestRetrySameIDNewToken(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	w, _, _ := startWorker(t, nc, eng, Config{ID: "w1"})
	defer close(eng.release) // the second attempt finishes: the worker stops at once
	first, second := schemas.NewCancelToken(), schemas.NewCancelToken()
	a := send(t, nc, schemas.WorkSubject("w1"), "r1", map[string]string{schemas.HdrCancelToken: first})
	accepted := func(f *frames) func() error {
		return func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.got) == 0 || f.got[0].Type != schemas.FrameAccepted {
				return fmt.Errorf("not accepted yet")
			}
			return nil
		}
	}
	testenv.WaitFor(t, 2*time.Second, accepted(a))
	b := send(t, nc, schemas.WorkSubject("w1"), "r1", map[string]string{schemas.HdrCancelToken: second})
	testenv.WaitFor(t, 2*time.Second, accepted(b))
	dup := send(t, nc, schemas.WorkSubject("w1"), "r1", map[string]string{schemas.HdrCancelToken: second})
	testenv.WaitFor(t, 2*time.Second, func() error {
		f := dup.last()
		if f.Type != schemas.FrameError || !strings.Contains(string(f.Payload), "duplicate_request") {
			return fmt.Errorf("the same id and token twice: last frame %s %s", f.Type, f.Payload)
		}
		return nil
	})
	if w.Running() != 2 {
		t.Fatalf("%d running, want both attempts", w.Running())
	}
	if err := nc.Publish(schemas.CancelSubject("w1"), schemas.CancelBody("r1", first)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if eng.canceled.Load() != 1 || w.Running() != 1 {
			return fmt.Errorf("canceled %d running %d, want the first attempt only", eng.canceled.Load(), w.Running())
		}
		return nil
	})
}

// When a frame may skip the linger: after a quiet spell, unless the last
// message carried several streams' frames recently (streams between two
// engine steps).
func TestOutboxQuiet(t *testing.T) {
	const linger = time.Millisecond
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		linger time.Duration // 0: linger
		lastN  int
		since  time.Duration
		want   bool
	}{
		{"lingering off", -1, 16, 0, true},
		{"just sent", 0, 1, 0, false},
		{"within the linger", 0, 1, linger / 2, false},
		{"quiet after a lone frame", 0, 1, 10 * time.Millisecond, true},
		{"quiet after nothing", 0, 0, 10 * time.Millisecond, true},
		{"between steps of several streams", 0, 16, 10 * time.Millisecond, false},
		{"between slow steps of two streams", 0, 2, burstGap - time.Millisecond, false},
		{"quiet long after several streams", 0, 16, burstGap, true},
	} {
		l := linger
		if tc.linger != 0 {
			l = tc.linger
		}
		ob := &outbox{w: &Worker{cfg: Config{ChunkLinger: l}}, last: t0, lastN: tc.lastN}
		if got := ob.quiet(t0.Add(tc.since)); got != tc.want {
			t.Errorf("%s: quiet = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Streams running together cross the bus as one message per engine step:
// after a message of several frames, the next step's first frame waits for
// the rest of its step; a lone stream's frame, and the first after a long
// quiet, never waits. (The test flushes held frames itself, as the linger
// loop would at most ChunkLinger later.)
func TestOutboxOneMessagePerStep(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	var mu sync.Mutex
	var sizes []int // frames per message, in order
	if _, err := nc.Subscribe("_INBOX.gw.>", func(m *nats.Msg) {
		n := 1
		if strings.HasSuffix(m.Subject, schemas.MuxToken) {
			n = 0
			if err := schemas.ForEachMuxEntry(m.Data, func(_, _ []byte) { n++ }); err != nil {
				t.Error(err)
			}
		}
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{ID: "w1", ChunkLinger: time.Millisecond}, nc, &gateEngine{}, nil) // not run: no linger loop
	if err != nil {
		t.Fatal(err)
	}
	w.partSize.Store(1 << 20)
	ob := w.outboxFor("_INBOX.gw.")
	frame := schemas.AppendFrame(nil, schemas.FrameChunk, 2, []byte(`{"choices":[]}`))
	held := func() int {
		ob.mu.Lock()
		defer ob.mu.Unlock()
		return ob.n
	}
	// step adds one frame for each of streams at once, after gap; it
	// returns how many of them the outbox holds back.
	step := func(gap time.Duration, streams int) int {
		at := time.Now().Add(gap)
		for i := range streams {
			if err := ob.add(fmt.Sprintf("_INBOX.gw.s%d", i), fmt.Sprintf("s%d", i), frame, false, at.Add(time.Duration(i)*time.Microsecond)); err != nil {
				t.Fatal(err)
			}
		}
		return held()
	}
	for _, s := range []struct {
		name          string
		gap           time.Duration
		streams, held int
	}{
		{"a lone stream's frame goes at once", 0, 1, 0},
		{"the first step of three streams: its first frame goes alone", 10 * time.Millisecond, 3, 2},
		{"the next step waits whole", 10 * time.Millisecond, 3, 3},
		{"after a long quiet a frame goes at once", 2 * burstGap, 1, 0},
	} {
		if got := step(s.gap, s.streams); got != s.held {
			t.Fatalf("%s: %d frames held, want %d", s.name, got, s.held)
		}
		ob.flushLinger()
	}
	want := []int{1, 1, 2, 3, 1}
	testenv.WaitFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(sizes, want) {
			return fmt.Errorf("frames per message %v, want %v", sizes, want)
		}
		return nil
	})
}
