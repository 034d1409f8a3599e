package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// startStreams starts n chat requests (ids r0, r1...) on a client of a
// fresh NATS server: their streams, their reply subjects, and the
// connection that plays the worker.
func startStreams(t *testing.T, n int) ([]*Stream, []string, *nats.Conn) {
	t.Helper()
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	wc := testenv.Connect(t, ns)
	reqs := make(chan *nats.Msg, n)
	if _, err := wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) { reqs <- m }); err != nil {
		t.Fatal(err)
	}
	if err := wc.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := New(nc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	streams, replies := make([]*Stream, n), make([]string, n)
	for i := range streams {
		s, err := c.Start(&Request{ID: fmt.Sprintf("r%d", i), Kind: schemas.KindChat, Model: "m", Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		streams[i] = s
		select {
		case m := <-reqs:
			replies[i] = m.Reply
		case <-time.After(5 * time.Second):
			t.Fatal("request not published")
		}
	}
	return streams, replies, wc
}

// A multiplexed reply that mixes streams still waiting for their first
// chunk with streams already flowing (which the client delivers in a second
// pass) reaches every stream complete and in order; plain replies interleave
// with it on the same streams.
func TestMuxDelivery(t *testing.T) {
	const n = 3
	streams, replies, wc := startStreams(t, n)
	frame := func(typ schemas.FrameType, seq uint64, payload string) []byte {
		return schemas.AppendFrame(nil, typ, seq, []byte(payload))
	}
	prefix, _, _ := schemas.SplitReply(replies[0])
	mux := func(entries ...any) {
		var body []byte
		for i := 0; i < len(entries); i += 2 {
			_, tok, _ := schemas.SplitReply(replies[entries[i].(int)])
			body = schemas.AppendMuxEntry(body, tok, entries[i+1].([]byte))
		}
		if err := wc.Publish(prefix+schemas.MuxToken, body); err != nil {
			t.Fatal(err)
		}
	}
	acc := func(i int) []byte {
		return frame(schemas.FrameAccepted, 1, fmt.Sprintf(`{"request_id":"r%d","worker":"w","cancel":"c"}`, i))
	}
	// Stream 0 starts first; then one message has stream 0 flowing and
	// streams 1 and 2 starting, interleaved.
	mux(0, acc(0), 0, frame(schemas.FrameChunk, 2, "a0"))
	mux(1, acc(1), 0, frame(schemas.FrameChunk, 3, "a1"), 2, acc(2), 1, frame(schemas.FrameChunk, 2, "b0"),
		0, frame(schemas.FrameChunk, 4, "a2"), 2, frame(schemas.FrameChunk, 2, "c0"), 1, frame(schemas.FrameChunk, 3, "b1"))
	_ = wc.Publish(replies[2], frame(schemas.FrameChunk, 3, "c1")) // plain, after the mux
	mux(0, frame(schemas.FrameDone, 5, `{}`), 1, frame(schemas.FrameDone, 4, `{}`), 2, frame(schemas.FrameDone, 4, `{}`))

	want := [][]string{{"a0", "a1", "a2"}, {"b0", "b1"}, {"c0", "c1"}}
	for i, s := range streams {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var got []string
		for {
			f, err := s.Next(ctx)
			if err != nil {
				cancel()
				t.Fatalf("stream %d after %v: %v", i, got, err)
			}
			if f.Type == schemas.FrameDone {
				break
			}
			got = append(got, string(f.Payload))
		}
		cancel()
		if fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Errorf("stream %d: %v, want %v", i, got, want[i])
		}
		if s.Worker() != "w" {
			t.Errorf("stream %d: worker %q", i, s.Worker())
		}
	}
}

// The stall timer: no first frame, silence after accepted, and frames that
// keep a stream alive past StallTimeout, including a queued frame's longer wait.
func TestStall(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	wc := testenv.Connect(t, ns)
	reqs := make(chan *nats.Msg, 8)
	if _, err := wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) { reqs <- m }); err != nil {
		t.Fatal(err)
	}
	if err := wc.Flush(); err != nil {
		t.Fatal(err)
	}
	const first, stall = 300 * time.Millisecond, 400 * time.Millisecond
	// Failover off: what a stall ends with (failover_test.go has the retries).
	c, err := New(nc, Options{FirstFrameTimeout: first, StallTimeout: stall, MigrationLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frame := func(typ schemas.FrameType, seq uint64, payload string) []byte {
		return schemas.AppendFrame(nil, typ, seq, []byte(payload))
	}
	accepted := frame(schemas.FrameAccepted, 1, `{"request_id":"r","worker":"w","cancel":"c"}`)

	for _, tc := range []struct {
		name   string
		worker func(reply string) // what the worker sends, from its own goroutine
		code   string             // the error code Next ends with ("" = done)
		min    time.Duration      // the least time it may take
	}{
		{"no first frame", func(string) {}, schemas.CodeNoDispatcher, first},
		{"silent after accepted", func(r string) { _ = wc.Publish(r, accepted) }, schemas.CodeStreamLost, stall},
		{"keepalives keep it alive", func(r string) {
			_ = wc.Publish(r, accepted)
			for i := uint64(2); i < 8; i++ { // 6 × 150 ms: past StallTimeout, never silent that long
				time.Sleep(150 * time.Millisecond)
				_ = wc.Publish(r, frame(schemas.FrameKeepalive, i, ""))
			}
			_ = wc.Publish(r, frame(schemas.FrameDone, 8, `{}`))
		}, "", 900 * time.Millisecond},
		{"silent after queued then accepted", func(r string) {
			_ = wc.Publish(r, frame(schemas.FrameQueued, 0, `{"position":1,"timeout_ms":2000}`))
			time.Sleep(100 * time.Millisecond)
			_ = wc.Publish(r, accepted) // StallTimeout from here, not the queue's longer wait
		}, schemas.CodeStreamLost, 500 * time.Millisecond},
		{"queued waits its timeout", func(r string) {
			_ = wc.Publish(r, frame(schemas.FrameQueued, 0, `{"position":1,"timeout_ms":500}`))
			time.Sleep(700 * time.Millisecond) // past FirstFrameTimeout and StallTimeout, within 500 ms + StallTimeout
			_ = wc.Publish(r, accepted)
			_ = wc.Publish(r, frame(schemas.FrameDone, 2, `{}`))
		}, "", 700 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			s, err := c.Start(&Request{ID: "r", Kind: schemas.KindChat, Model: "m", Body: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			select {
			case m := <-reqs:
				go tc.worker(m.Reply)
			case <-time.After(5 * time.Second):
				t.Fatal("request not published")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var code string
			for {
				f, err := s.Next(ctx)
				if err != nil {
					var e *schemas.Error
					if !errors.As(err, &e) || e.Body.Code == nil {
						t.Fatalf("Next: %v", err)
					}
					code = *e.Body.Code
					break
				}
				if f.Type == schemas.FrameDone {
					break
				}
			}
			if d := time.Since(start); code != tc.code || d < tc.min || d > tc.min+time.Second {
				t.Fatalf("ended with %q after %s; want %q after at least %s", code, d, tc.code, tc.min)
			}
		})
	}
}

// New returns only once the server has the reply subscription: a request can
// leave on another connection (an embedded dispatcher's) and its worker
// answer at once, and a SUB still in this connection's buffer would lose the
// first frame (seen as "expected frame 1, got 2" on the first request of a
// freshly started gateway).
func TestNewSubscribesBeforeReturning(t *testing.T) {
	ns := testenv.NATS(t)
	for i := range 20 {
		nc := testenv.Connect(t, ns)
		before := ns.NumSubscriptions()
		c, err := New(nc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if after := ns.NumSubscriptions(); after != before+1 {
			t.Fatalf("client %d: the server has %d subscriptions right after New, want %d", i, after, before+1)
		}
		c.Close()
		// Close's UNSUB is not flushed: wait for it, or it could land during
		// the next New and make the next count look one short.
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// A stream whose worker is known to be gone, or whose numbering has a gap,
// ends at once with stream_lost, not after its stall timeout (here 10 s).
func TestFailsFast(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	wc := testenv.Connect(t, ns)
	reqs := make(chan *nats.Msg, 8)
	if _, err := wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) { reqs <- m }); err != nil {
		t.Fatal(err)
	}
	if err := wc.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := New(nc, Options{FirstFrameTimeout: 10 * time.Second, StallTimeout: 10 * time.Second, MigrationLimit: -1}) // failover off: the stream ends
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frame := func(typ schemas.FrameType, seq uint64, payload string) []byte {
		return schemas.AppendFrame(nil, typ, seq, []byte(payload))
	}
	accepted := frame(schemas.FrameAccepted, 1, `{"request_id":"r","worker":"w9","cancel":"c"}`)
	chunk := func(seq uint64) []byte { return frame(schemas.FrameChunk, seq, `{"choices":[]}`) }
	for _, tc := range []struct {
		name   string
		worker func(reply string, read <-chan struct{}) // read: the reader has the first chunk
	}{
		{"gap", func(r string, _ <-chan struct{}) {
			_ = wc.Publish(r, accepted)
			_ = wc.Publish(r, chunk(2))
			_ = wc.Publish(r, chunk(4))
		}},
		{"worker lost", func(r string, read <-chan struct{}) {
			_ = wc.Publish(r, accepted)
			_ = wc.Publish(r, chunk(2))
			_ = wc.Flush()
			// The fault comes after the chunk has reached the reader (the
			// accepted frame alone does not say the chunk has).
			select {
			case <-read:
			case <-time.After(5 * time.Second):
				t.Error("the first chunk never reached the reader")
			}
			c.WorkerLost("w9", "heartbeats stopped")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := c.Start(&Request{ID: "r", Kind: schemas.KindChat, Model: "m", Body: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			m := <-reqs
			start := time.Now()
			read := make(chan struct{})
			go tc.worker(m.Reply, read)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			chunks := 0
			for {
				f, err := s.Next(ctx)
				if err != nil {
					var e *schemas.Error
					if !errors.As(err, &e) || e.Body.Code == nil || *e.Body.Code != schemas.CodeStreamLost {
						t.Fatalf("Next: %v, want stream_lost", err)
					}
					break
				}
				if f.Type == schemas.FrameChunk {
					if chunks++; chunks == 1 {
						close(read)
					}
				}
			}
			if d := time.Since(start); chunks != 1 || d > 2*time.Second {
				t.Fatalf("ended after %s with %d chunks; want at once, after the one chunk before the fault", d, chunks)
			}
		})
	}
}
