package enginetest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine"
)

// Sink records what an engine hands over: each Chunks call's lines (copied:
// the engine may reuse its buffer), and the calls made after Generate
// returned, which the contract forbids. It is the recording sink of the
// engines' tests too (those that can import this package).
type Sink struct {
	// OnCall, if set, is called with the number of the call (from 1);
	// Chunks returns its error.
	OnCall func(call int) error

	mu       sync.Mutex
	calls    [][]string
	returned bool
	late     int
	first    chan struct{} // closed by the first call
}

func newSink() *Sink { return &Sink{first: make(chan struct{})} }

// Chunks implements engine.Sink.
func (s *Sink) Chunks(b []byte) error {
	s.mu.Lock()
	if s.first == nil {
		s.first = make(chan struct{})
	}
	var lines []string
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		lines = append(lines, string(l))
	}
	s.calls = append(s.calls, lines)
	n := len(s.calls)
	if s.returned {
		s.late++
	}
	if n == 1 {
		close(s.first)
	}
	f := s.OnCall
	s.mu.Unlock()
	if f != nil {
		return f(n)
	}
	return nil
}

// Lines are the chunk lines handed over so far, in order.
func (s *Sink) Lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		out = append(out, c...)
	}
	return out
}

// Calls is the number of Chunks calls so far.
func (s *Sink) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// done notes that Generate returned.
func (s *Sink) done() {
	s.mu.Lock()
	s.returned = true
	s.mu.Unlock()
}

// checkNoLate fails if the sink was called after Generate returned.
func (s *Sink) checkNoLate(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.late > 0 {
		t.Errorf("Sink.Chunks called %d times after Generate returned", s.late)
	}
}

// outcome is what Generate returned.
type outcome struct {
	res *engine.Result
	err error
}

// generate runs req to its end.
func generate(ctx context.Context, e engine.Engine, req *engine.Request, s *Sink) (*engine.Result, error) {
	res, err := e.Generate(ctx, req, s)
	s.done()
	return res, err
}

// goGenerate runs req in a goroutine; its outcome comes on the channel.
func goGenerate(ctx context.Context, e engine.Engine, req *engine.Request, s *Sink) <-chan outcome {
	c := make(chan outcome, 1)
	go func() {
		res, err := generate(ctx, e, req, s)
		c <- outcome{res, err}
	}()
	return c
}

// await is the outcome of a goGenerate, which must come within d.
func await(t *testing.T, c <-chan outcome, d time.Duration, what string) outcome {
	t.Helper()
	select {
	case o := <-c:
		return o
	case <-time.After(d):
		t.Fatalf("Generate did not return within %s of %s", d, what)
		return outcome{}
	}
}

// firstChunk waits for the sink's first call.
func (s *Sink) firstChunk(t *testing.T) {
	t.Helper()
	select {
	case <-s.first:
	case <-time.After(waitLong):
		t.Fatalf("no chunk within %s", waitLong)
	}
}
