package client

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

// Frames handed over in memory (Deliver) reach their streams complete and
// in order while two workers' goroutines deliver at once; an accepted frame for a stream that has ended
// cancels the request on the bus, as when it comes by the bus.
func TestDeliver(t *testing.T) {
	streams, replies, wc := startStreams(t, 3)
	c := streams[0].c
	token := func(i int) string {
		prefix, tok, _ := schemas.SplitReply(replies[i])
		if prefix != c.Prefix() {
			t.Fatalf("reply %q is not under the client's prefix %q", replies[i], c.Prefix())
		}
		return tok
	}
	const chunks = 200
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			deliver := func(typ schemas.FrameType, seq uint64, payload string) {
				c.Deliver(token(i), schemas.AppendFrame(nil, typ, seq, []byte(payload)))
			}
			deliver(schemas.FrameAccepted, 1, fmt.Sprintf(`{"request_id":"r%d","worker":"w","cancel":"c"}`, i))
			for j := range chunks {
				deliver(schemas.FrameChunk, uint64(j+2), fmt.Sprintf("s%d-%d", i, j))
			}
			deliver(schemas.FrameDone, chunks+2, `{}`)
		})
	}
	for i, s := range streams[:2] {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n := 0
		for {
			f, err := s.Next(ctx)
			if err != nil {
				cancel()
				t.Fatalf("stream %d after %d chunks: %v", i, n, err)
			}
			if f.Type == schemas.FrameDone {
				break
			}
			if want := fmt.Sprintf("s%d-%d", i, n); string(f.Payload) != want {
				cancel()
				t.Fatalf("stream %d chunk %d: %q, want %q", i, n, f.Payload, want)
			}
			n++
		}
		cancel()
		if n != chunks {
			t.Fatalf("stream %d: %d chunks, want %d", i, n, chunks)
		}
	}
	wg.Wait()

	// Stream 2 ends before its worker accepts it.
	cancels := make(chan *nats.Msg, 4)
	if _, err := wc.ChanSubscribe("late.cancel", cancels); err != nil {
		t.Fatal(err)
	}
	if err := wc.Flush(); err != nil {
		t.Fatal(err)
	}
	streams[2].Close()
	c.Deliver(token(2), schemas.AppendFrame(nil, schemas.FrameAccepted, 1,
		[]byte(`{"request_id":"r2","worker":"w","cancel":"late.cancel","cancel_token":"k"}`)))
	select {
	case m := <-cancels:
		if string(m.Data) != string(schemas.CancelBody("r2", "k")) {
			t.Fatalf("cancel body %q", m.Data)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an accepted frame for an ended stream cancelled nothing")
	}
}
