package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// fakeBus stands for the dispatchers and workers: it hands the test every
// request the client publishes, and the cancels it sends.
type fakeBus struct {
	wc      *nats.Conn
	reqs    chan *nats.Msg
	mu      sync.Mutex
	cancels []string // subject: body
}

func newFakeBus(t *testing.T) (*fakeBus, *nats.Conn) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	fb := &fakeBus{wc: testenv.Connect(t, ns), reqs: make(chan *nats.Msg, 16)}
	if _, err := fb.wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) { fb.reqs <- m }); err != nil {
		t.Fatal(err)
	}
	record := func(m *nats.Msg) {
		fb.mu.Lock()
		fb.cancels = append(fb.cancels, m.Subject+": "+string(m.Data))
		fb.mu.Unlock()
	}
	if _, err := fb.wc.Subscribe("cancel.>", record); err != nil {
		t.Fatal(err)
	}
	if _, err := fb.wc.Subscribe(schemas.QueueCancel, record); err != nil {
		t.Fatal(err)
	}
	if err := fb.wc.Flush(); err != nil {
		t.Fatal(err)
	}
	return fb, nc
}

func (fb *fakeBus) next(t *testing.T) *nats.Msg {
	t.Helper()
	select {
	case m := <-fb.reqs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no request published")
		return nil
	}
}

func (fb *fakeBus) cancelled(sub string) error {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	for _, c := range fb.cancels {
		if strings.HasPrefix(c, sub+": ") {
			return nil
		}
	}
	return fmt.Errorf("no cancel on %s; got %q", sub, fb.cancels)
}

// fakeWorker streams a chat completion the way a worker and the sim do.
type fakeWorker struct {
	t     *testing.T
	wc    *nats.Conn
	reply string
	id    string // worker id
	chat  string // chunk id
	seq   uint64
}

func (w *fakeWorker) send(typ schemas.FrameType, payload string) {
	w.seq++
	if err := w.wc.Publish(w.reply, schemas.AppendFrame(nil, typ, w.seq, []byte(payload))); err != nil {
		w.t.Fatal(err)
	}
}

func (w *fakeWorker) accept(reqID string) {
	w.send(schemas.FrameAccepted, fmt.Sprintf(`{"request_id":%q,"worker":%q,"cancel":"cancel.%s","cancel_token":"tok-%s"}`, reqID, w.id, w.id, w.id))
}

func (w *fakeWorker) chunk(delta string) {
	w.send(schemas.FrameChunk, fmt.Sprintf(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":"m","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":null}]}`,
		w.chat, len(w.id), delta))
}

func (w *fakeWorker) token(text string) { w.chunk(fmt.Sprintf(`{"content":%q}`, text)) }

func (w *fakeWorker) finish(promptTokens, completionTokens int) {
	w.send(schemas.FrameChunk, fmt.Sprintf(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`, w.chat, len(w.id)))
	w.send(schemas.FrameDone, fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		promptTokens, completionTokens, promptTokens+completionTokens))
}

// A worker that fails mid-stream, however the client learns of it (a gap, a
// WorkerLost, a stall, an error frame that another worker may not give):
// the client sends a continuation, with the failed worker excluded and the
// tokens already streamed, and the reader sees one stream: the exact chunk
// sequence, one id, no token lost or repeated, usage over the whole
// completion, each chunk byte for byte as the workers wrote it but for the
// values spliced (its keys in their order). Late frames of the failed
// worker are ignored, and it gets a cancel.
func TestMigrationSplicesOneStream(t *testing.T) {
	const body = `{"model":"m","stream":true,"max_tokens":6,"seed":7,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name   string
		fail   func(c *Client, w *fakeWorker) // the fault, after three tokens
		reason string
	}{
		{"gap", func(_ *Client, w *fakeWorker) { w.seq++; w.token(" lost") }, ReasonGap},
		{"worker lost", func(c *Client, _ *fakeWorker) { c.WorkerLost("w1", "heartbeats stopped") }, ReasonWorkerLost},
		{"silent", func(*Client, *fakeWorker) {}, ReasonSilent},
		{"shutting down", func(_ *Client, w *fakeWorker) {
			w.send(schemas.FrameError, string(schemas.ErrShuttingDown.New("worker w1").Payload()))
		}, "shutting_down"},
		{"engine cut the stream", func(_ *Client, w *fakeWorker) {
			w.send(schemas.FrameError, string(schemas.ErrEngineTruncated.New("the body ended after 4 chunks, before any finish_reason").Payload()))
		}, schemas.CodeEngineTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb, nc := newFakeBus(t)
			var events []Failover
			c, err := New(nc, Options{StallTimeout: 300 * time.Millisecond, OnFailover: func(ev Failover) { events = append(events, ev) }})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.Start(&Request{ID: "r1", Kind: schemas.KindChat, Model: "m", Body: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The reader runs as a gateway's does: failover happens in Next.
			type result struct {
				f   schemas.Frame
				err error
			}
			frames := make(chan result, 16)
			go func() {
				for {
					f, err := st.Next(ctx)
					frames <- result{f, err}
					if err != nil || f.Type == schemas.FrameDone {
						close(frames)
						return
					}
				}
			}()
			var got []string
			read := func(n int) {
				t.Helper()
				for range n {
					r := <-frames
					if r.err != nil {
						t.Fatalf("Next after %q: %v", got, r.err)
					}
					got = append(got, strings.TrimSpace(string(r.f.Payload)))
				}
			}

			m1 := fb.next(t)
			w1 := &fakeWorker{t: t, wc: fb.wc, reply: m1.Reply, id: "w1", chat: "chatcmpl-1"}
			w1.accept("r1")
			w1.chunk(`{"role":"assistant","content":""}`)
			w1.token("The")
			w1.token(" sea")
			w1.token(",")
			read(4)
			tc.fail(c, w1)

			m2 := fb.next(t) // the continuation
			if x, r := m2.Header.Get(schemas.HdrExclude), m2.Header.Get(schemas.HdrResume); x != "w1" || r != "3" {
				t.Fatalf("continuation headers: exclude %q resume %q; want w1, 3", x, r)
			}
			if m2.Reply == m1.Reply || m2.Header.Get(schemas.HdrCancelToken) == m1.Header.Get(schemas.HdrCancelToken) {
				t.Fatal("the continuation reuses the reply subject or the cancel token")
			}
			var cb map[string]any
			if err := json.Unmarshal(m2.Data, &cb); err != nil {
				t.Fatal(err)
			}
			msgs, _ := json.Marshal(cb["messages"])
			if string(msgs) != `[{"content":"hi","role":"user"},{"content":"The sea,","role":"assistant"}]` ||
				cb["continue_final_message"] != true || cb["add_generation_prompt"] != false ||
				cb["max_tokens"] != 3.0 || cb["seed"] != 7.0 || cb["ignore_eos"] != true {
				t.Fatalf("continuation body: %s", m2.Data)
			}
			w1.token(" late") // the failed worker's late frame: lands nowhere
			w2 := &fakeWorker{t: t, wc: fb.wc, reply: m2.Reply, id: "w2", chat: "chatcmpl-2"}
			w2.accept("r1")
			w2.chunk(`{"role":"assistant","content":""}`)
			w2.token(" red")
			w2.token(" sky")
			w2.token(" now")
			w2.finish(12+3, 3)
			read(4)
			last := <-frames
			if last.err != nil || last.f.Type != schemas.FrameDone {
				t.Fatalf("last frame: %v %v", last.f.Type, last.err)
			}
			got = append(got, string(last.f.Payload))

			chunk := func(delta, finish string) string {
				return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}`, delta, finish)
			}
			want := []string{chunk(`{"role":"assistant","content":""}`, "null"), chunk(`{"content":"The"}`, "null"),
				chunk(`{"content":" sea"}`, "null"), chunk(`{"content":","}`, "null"),
				chunk(`{"content":" red"}`, "null"), chunk(`{"content":" sky"}`, "null"), chunk(`{"content":" now"}`, "null"),
				chunk(`{}`, `"length"`), `{"usage":{"prompt_tokens":12,"completion_tokens":6,"total_tokens":18}}`}
			if len(got) != len(want) {
				t.Fatalf("got %d frames, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("frame %d: got %s\nwant %s", i, got[i], want[i])
				}
			}
			if r, more := <-frames; more {
				t.Fatalf("a frame after done: %v", r)
			}
			testenv.WaitFor(t, 5*time.Second, func() error { return fb.cancelled("cancel.w1") })
			if len(events) != 1 || events[0].Kind != FailoverMigration || events[0].Reason != tc.reason || events[0].Tokens != 3 {
				t.Fatalf("events %+v; want one migration for %s after 3 tokens", events, tc.reason)
			}
		})
	}
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// Before the first token a failed attempt is sent again as it was (a
// retry), excluding every worker that failed it, at most MigrationLimit
// times; then the stream fails with the last error. A completion is
// continued with its prompt extended.
func TestRetryBeforeFirstToken(t *testing.T) {
	fb, nc := newFakeBus(t)
	var events []Failover
	c, err := New(nc, Options{MigrationLimit: 2, OnFailover: func(ev Failover) { events = append(events, ev) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const body = `{"model":"m","stream":true,"prompt":"once"}`
	st, err := c.Start(&Request{ID: "r2", Kind: schemas.KindCompletion, Model: "m", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := st.Next(ctx)
		done <- err
	}()
	for i, wantExclude := range []string{"", "w0", "w0,w1"} {
		m := fb.next(t)
		if string(m.Data) != body || m.Header.Get(schemas.HdrExclude) != wantExclude || m.Header.Get(schemas.HdrResume) != "" {
			t.Fatalf("attempt %d: exclude %q resume %q body %s", i, m.Header.Get(schemas.HdrExclude), m.Header.Get(schemas.HdrResume), m.Data)
		}
		w := &fakeWorker{t: t, wc: fb.wc, reply: m.Reply, id: fmt.Sprintf("w%d", i)}
		w.accept("r2")
		w.send(schemas.FrameError, string(schemas.ErrWorkerBusy.New().Payload()))
	}
	err = <-done
	var e *schemas.Error
	if !errors.As(err, &e) || !schemas.ErrWorkerBusy.Is(e) {
		t.Fatalf("after the limit: %v; want worker_busy", err)
	}
	if len(events) != 3 || events[0].Kind != FailoverRetry || events[1].Kind != FailoverRetry || events[2].Kind != FailoverFailed {
		t.Fatalf("events %+v; want retry, retry, migration_failed", events)
	}
	select {
	case m := <-fb.reqs:
		t.Fatalf("a fourth attempt: %v", m.Header)
	default:
	}

	// A completion continued: the prompt with what was generated.
	out, why := continuationBody(schemas.KindCompletion, []byte(`{"prompt":"once","max_tokens":10,"min_tokens":4,"seed":1}`), " upon a", 2)
	if why != "" || !sameJSON(string(out), `{"prompt":"once upon a","max_tokens":8,"min_tokens":2,"seed":1}`) {
		t.Fatalf("completion continuation: %s %s", out, why)
	}
}

// What cannot be continued fails as before: a stream longer than
// MigrationMaxSeqLen, a body with n > 1, a request that is not retryable.
func TestMigrationRefused(t *testing.T) {
	const hi = `{"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, body string
		maxSeq     int
		deltas     []string // what the worker streams before the gap; nil: three tokens
	}{
		{"too long", hi, 2, nil},
		{"n > 1", `{"stream":true,"n":2,"messages":[{"role":"user","content":"hi"}]}`, 0, nil},
		// Half a tool call's arguments: a continuation would call it again.
		{"tool-call arguments", hi, 0, []string{
			`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]}`,
			`{"tool_calls":[{"index":0,"function":{"arguments":"{"ci"}}]}`}},
		{"reasoning", hi, 0, []string{`{"role":"assistant","content":""}`, `{"reasoning_content":"Let me think"}`, `{"content":"So"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb, nc := newFakeBus(t)
			c, err := New(nc, Options{MigrationMaxSeqLen: tc.maxSeq})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.Start(&Request{ID: "r3", Kind: schemas.KindChat, Model: "m", Body: []byte(tc.body)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			w := &fakeWorker{t: t, wc: fb.wc, reply: fb.next(t).Reply, id: "w1", chat: "c1"}
			w.accept("r3")
			if tc.deltas == nil {
				w.token("a")
				w.token(" b")
				w.token(" c")
			}
			for _, d := range tc.deltas {
				w.chunk(d)
			}
			w.seq++
			w.token(" d") // a gap
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err2 error
			for n := 0; err2 == nil; n++ {
				_, err2 = st.Next(ctx)
			}
			var e *schemas.Error
			if !errors.As(err2, &e) || !schemas.ErrStreamGap.Is(e) {
				t.Fatalf("%v; want stream_lost", err2)
			}
			select {
			case m := <-fb.reqs:
				t.Fatalf("sent again: %s", m.Data)
			default:
			}
		})
	}
}

// A request queued in a dispatcher that beats (schemas.Queued BeatMS) is
// sent again when the beats stop (the dispatcher died), after four beats
// of silence (at least 3 s) instead of the queue's whole timeout; beats
// that keep coming keep it waiting.
func TestDispatcherGoneWhileQueued(t *testing.T) {
	fb, nc := newFakeBus(t)
	var events []Failover
	c, err := New(nc, Options{OnFailover: func(ev Failover) { events = append(events, ev) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queued := func(reply string) {
		// A cold start's hold: five minutes to wait, a beat every 200 ms.
		_ = fb.wc.Publish(reply, schemas.AppendFrame(nil, schemas.FrameQueued, 0,
			[]byte(`{"position":1,"timeout_ms":300000,"cold":true,"beat_ms":200,"dispatcher":"d1"}`)))
	}
	st, err := c.Start(&Request{ID: "rq", Kind: schemas.KindChat, Model: "m", Body: []byte(`{"model":"m","messages":[]}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for {
			f, err := st.Next(ctx)
			if err != nil || f.Type == schemas.FrameDone {
				done <- err
				return
			}
		}
	}()

	// The first dispatcher beats for 4 s (past the 3 s floor), then dies.
	m := fb.next(t)
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	for time.Since(start) < 4*time.Second {
		queued(m.Reply)
		<-tick.C
	}
	tick.Stop()
	if !st.HeldForCapacity() {
		t.Fatal("a stream queued cold does not say it is held for capacity")
	}
	died := time.Now()
	again := fb.next(t) // sent again: to another dispatcher
	if waited := time.Since(died); waited < 2500*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("sent again %v after the last beat; want about 3 s (4 beats, at least 3 s)", waited)
	}
	w := &fakeWorker{t: t, wc: fb.wc, reply: again.Reply, id: "w1", chat: "chatcmpl-1"}
	w.accept("rq")
	w.token("hi")
	w.finish(1, 1)
	if err := <-done; err != nil {
		t.Fatalf("after the resend: %v", err)
	}
	if len(events) != 1 || events[0].Kind != FailoverRetry || events[0].Reason != ReasonDispatcherGone {
		t.Fatalf("failover events %+v; want one retry for %s", events, ReasonDispatcherGone)
	}
}

// What a continuation cannot finish is told from what is merely there: a
// null or empty tool_calls or reasoning_content (some servers send them in
// every delta) does not stop a migration.
func TestStructuredDelta(t *testing.T) {
	for _, tc := range []struct{ delta, want string }{
		{`{"content":"a"}`, ""},
		{`{"content":"a","tool_calls":null,"reasoning_content":null}`, ""},
		{`{"content":"a","tool_calls":[],"reasoning_content":""}`, ""},
		{`{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}`, "tool calls"},
		{`{"function_call":{"name":"f"}}`, "tool calls"},
		{`{"reasoning_content":"hmm"}`, "reasoning"},
		{`{"reasoning":"hmm"}`, "reasoning"},
		{`not json`, ""},
	} {
		if got := structuredDelta([]byte(tc.delta)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.delta, got, tc.want)
		}
	}
}
