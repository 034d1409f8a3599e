package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func testModels(t *testing.T, h *Harness) {
	e := start(t, h)
	testenv.WaitFor(t, waitLong, func() error {
		if ms := e.Models(); !slices.Contains(ms, h.Model) {
			return fmt.Errorf("Models() = %q, without %q", ms, h.Model)
		}
		return nil
	})
}

func testHealth(t *testing.T, h *Harness) {
	e := start(t, h)
	if err := e.Health(t.Context()); err != nil {
		t.Fatalf("Health of an engine New returned: %v", err)
	}
}

// running waits until Stats counts a request running.
func running(t *testing.T, e engine.Engine) {
	t.Helper()
	testenv.WaitFor(t, waitLong, func() error {
		if st := e.Stats(); st.Running < 1 {
			return fmt.Errorf("a request runs, Stats says %+v", st)
		}
		return nil
	})
}

// idle waits until Stats shows nothing running, waiting or held in the KV cache.
func idle(t *testing.T, e engine.Engine) {
	t.Helper()
	testenv.WaitFor(t, waitLong, func() error {
		if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.KVCacheUsage != 0 {
			return fmt.Errorf("the request still counts in Stats: %+v", st)
		}
		return nil
	})
}

// Cancelling ctx ends a request promptly with context.Canceled, streamed or
// not, and Stats drops back.
func testCancel(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream %v", stream), func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s := newSink()
			out := goGenerate(ctx, e, request(t, schemas.KindChat, h.Model, fmt.Sprintf(`"stream":%v,%s`, stream, h.long())), s)
			if stream {
				s.firstChunk(t)
			}
			running(t, e)
			cancel()
			if o := await(t, out, promptly, "its cancel"); !errors.Is(o.err, context.Canceled) {
				t.Fatalf("Generate returned %v, %v; want context.Canceled", o.res, o.err)
			}
			idle(t, e)
			s.checkNoLate(t)
		})
	}
}

var errGone = errors.New("enginetest: the client is gone")

// A Sink error (the client is gone) ends the request with that error, with
// no Sink call after it, and Stats drops back.
func testSinkError(t *testing.T, h *Harness) {
	e := start(t, h)
	s := newSink()
	s.OnCall = func(call int) error {
		if call >= 2 {
			return errGone
		}
		return nil
	}
	out := goGenerate(t.Context(), e, request(t, schemas.KindCompletion, h.Model, `"stream":true,`+h.long()), s)
	if o := await(t, out, waitLong, "its start"); !errors.Is(o.err, errGone) {
		t.Fatalf("Generate returned %v, %v; want the sink's error", o.res, o.err)
	}
	if n := s.Calls(); n != 2 {
		t.Errorf("%d Sink.Chunks calls, want 2: none after the one that failed", n)
	}
	idle(t, e)
	s.checkNoLate(t)
}

// Request.Deadline ends a request with context.DeadlineExceeded, streamed or
// not, and Stats drops back.
func testDeadline(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream %v", stream), func(t *testing.T) {
			req := request(t, schemas.KindChat, h.Model, fmt.Sprintf(`"stream":%v,%s`, stream, h.long()))
			req.Deadline = time.Now().Add(100 * time.Millisecond)
			s := newSink()
			if o := await(t, goGenerate(t.Context(), e, req, s), promptly, "its deadline"); !errors.Is(o.err, context.DeadlineExceeded) {
				t.Fatalf("Generate returned %v, %v; want context.DeadlineExceeded", o.res, o.err)
			}
			idle(t, e)
			s.checkNoLate(t)
		})
	}
}

// Close ends the requests in flight with a 503 shutting_down, and so are
// the requests after it; Health fails and Stats is empty. Close again is no
// error.
func testClose(t *testing.T, h *Harness) {
	e := start(t, h)
	s := newSink()
	out := goGenerate(t.Context(), e, request(t, schemas.KindChat, h.Model, `"stream":true,`+h.long()), s)
	s.firstChunk(t)
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	if se := asError(t, await(t, out, promptly, "Close").err, 503); code(se) != schemas.CodeShuttingDown {
		t.Errorf("a request in flight at Close: %v, want code %s", se, schemas.CodeShuttingDown)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(promptly):
		t.Fatalf("Close did not return within %s", promptly)
	}
	_, err := generate(t.Context(), e, request(t, schemas.KindChat, h.Model, `"stream":true`), newSink())
	if se := asError(t, err, 503); code(se) != schemas.CodeShuttingDown {
		t.Errorf("a request after Close: %v, want code %s", se, schemas.CodeShuttingDown)
	}
	if err := e.Health(t.Context()); err == nil {
		t.Error("healthy after Close")
	}
	if st := e.Stats(); st.Running != 0 || st.Waiting != 0 {
		t.Errorf("Stats after Close %+v", st)
	}
	if err := e.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
	s.checkNoLate(t)
}
