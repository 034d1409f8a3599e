package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// recorder is a DirectWriter that records what it was given.
type recorder struct {
	mu      sync.Mutex
	got     []string
	ready   bool
	partial bool // Write reports that part of the payload waits
}

func (r *recorder) Ready(int) bool { r.mu.Lock(); defer r.mu.Unlock(); return r.ready }

func (r *recorder) Write(p []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, string(p))
	return !r.partial
}

func (r *recorder) set(ready, partial bool) {
	r.mu.Lock()
	r.ready, r.partial = ready, partial
	r.mu.Unlock()
}

func (r *recorder) taken() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// Chunks that arrive while the reader waits in Next go to the direct
// writer, in order, and Next does not return them; a write that leaves
// bytes behind makes Next return an empty chunk; a writer that is not ready,
// or a reader that is not waiting, gets the frames through Next as before.
func TestDirect(t *testing.T) {
	streams, replies, wc := startStreams(t, 1)
	s, reply := streams[0], replies[0]
	seq := uint64(0)
	send := func(typ schemas.FrameType, payload string) {
		t.Helper()
		seq++
		if err := wc.Publish(reply, schemas.AppendFrame(nil, typ, seq, []byte(payload))); err != nil {
			t.Fatal(err)
		}
		if err := wc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next := make(chan schemas.Frame, 16)
	read := func() { // one Next in the background
		go func() {
			f, err := s.Next(ctx)
			if err != nil {
				f = schemas.Frame{Type: schemas.FrameError, Payload: []byte(err.Error())}
			}
			next <- f
		}()
	}
	waitParked := func() {
		t.Helper()
		testenv.WaitFor(t, 5*time.Second, func() error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.parked {
				return errors.New("the reader is not waiting in Next")
			}
			return nil
		})
	}
	// lastFrame sets when the stream's previous frame came: d ago (negative:
	// in the future, so the next one follows it too closely for direct).
	lastFrame := func(d time.Duration) {
		s.mu.Lock()
		s.last = time.Now().Add(-d)
		s.mu.Unlock()
	}
	recv := func() schemas.Frame {
		t.Helper()
		select {
		case f := <-next:
			return f
		case <-time.After(5 * time.Second):
			t.Fatal("Next returned nothing")
		}
		return schemas.Frame{}
	}

	send(schemas.FrameAccepted, `{"request_id":"r0","worker":"w","cancel":"c"}`)
	send(schemas.FrameChunk, "a0")
	read()
	if f := recv(); string(f.Payload) != "a0" {
		t.Fatalf("first chunk %q", f.Payload)
	}

	w := &recorder{ready: true}
	s.Direct(w)
	read()
	waitParked()
	for _, c := range []string{"a1", "a2"} {
		lastFrame(time.Hour)
		send(schemas.FrameChunk, c)
		testenv.WaitFor(t, 5*time.Second, func() error {
			if got := w.taken(); len(got) == 0 || got[len(got)-1] != c {
				return fmt.Errorf("direct writer has %v, want %s last", got, c)
			}
			return nil
		})
	}
	select {
	case f := <-next:
		t.Fatalf("Next returned %s %q, which the direct writer took", f.Type, f.Payload)
	default:
	}

	// A chunk too soon after the previous frame goes through Next, which
	// sends what gathered in one write.
	lastFrame(-time.Hour)
	send(schemas.FrameChunk, "b")
	if f := recv(); string(f.Payload) != "b" {
		t.Fatalf("Next returned %q, want b", f.Payload)
	}
	read()
	waitParked()

	// A partial write: Next returns an empty chunk for the reader to send
	// the rest, and the writer is not used until the reader waits again.
	w.set(true, true)
	lastFrame(time.Hour)
	send(schemas.FrameChunk, "a3")
	if f := recv(); f.Type != schemas.FrameChunk || len(f.Payload) != 0 {
		t.Fatalf("after a partial write Next returned %s %q, want an empty chunk", f.Type, f.Payload)
	}
	if got := w.taken(); fmt.Sprint(got) != "[a1 a2 a3]" {
		t.Fatalf("direct writer has %v", got)
	}

	// Not ready: frames come through Next.
	w.set(false, false)
	read()
	waitParked()
	send(schemas.FrameChunk, "a4")
	if f := recv(); string(f.Payload) != "a4" {
		t.Fatalf("Next returned %q, want a4", f.Payload)
	}

	// Ready again, then no writer at all.
	w.set(true, false)
	read()
	waitParked()
	lastFrame(time.Hour)
	send(schemas.FrameChunk, "a5")
	testenv.WaitFor(t, 5*time.Second, func() error {
		if got := w.taken(); len(got) != 4 || got[3] != "a5" {
			return fmt.Errorf("direct writer has %v, want a5 last", got)
		}
		return nil
	})
	s.Direct(nil)
	send(schemas.FrameChunk, "a6")
	if f := recv(); string(f.Payload) != "a6" {
		t.Fatalf("Next returned %q, want a6", f.Payload)
	}
	send(schemas.FrameDone, `{}`)
	read()
	if f := recv(); f.Type != schemas.FrameDone {
		t.Fatalf("Next returned %s, want done", f.Type)
	}
}
