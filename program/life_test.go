package program

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The first part to fail ends every other part: shutdown runs once, release
// runs after the last part returned, and Wait and Close (any number of
// times) return that first error, named after its part.
func TestLifeFirstFailureEndsTheProgram(t *testing.T) {
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name string
		fail func() error
		want error
	}{
		{"error", func() error { return errBoom }, errBoom},
		{"returns early", func() error { return nil }, errStopped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLife()
			var shutdowns, released atomic.Int32
			blockedEnded := make(chan struct{})
			l.part("blocked", func() error { <-l.ctx.Done(); close(blockedEnded); return nil })
			fail := make(chan struct{})
			l.part("failing", func() error { <-fail; return tc.fail() })
			if err := l.begin(nil, func() { shutdowns.Add(1) }, func() {
				select {
				case <-blockedEnded:
				default:
					t.Error("released before every part returned")
				}
				released.Add(1)
			}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Done():
				t.Fatal("ended before any part failed")
			default:
			}
			close(fail)
			select {
			case <-l.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("a failed part did not end the program")
			}
			err := l.Wait()
			if !errors.Is(err, tc.want) || !strings.HasPrefix(err.Error(), "failing: ") {
				t.Fatalf("Wait: %v, want failing: %v", err, tc.want)
			}
			for range 2 {
				if cerr := l.Close(); cerr != err {
					t.Fatalf("Close: %v, want Wait's %v", cerr, err)
				}
			}
			if shutdowns.Load() != 1 || released.Load() != 1 {
				t.Fatalf("shutdown ran %d times, release %d, want once each", shutdowns.Load(), released.Load())
			}
		})
	}
}

// A start that fails is closed at once; a part that failed while the start
// waited for it is reported as itself.
func TestLifeStartFailure(t *testing.T) {
	errPart := errors.New("id in use")
	l := newLife()
	ready := make(chan struct{})
	l.part("worker", func() error { return errPart })
	err := l.waitReady(t.Context(), ready, "the worker")
	var released bool
	err = l.begin(err, func() {}, func() { released = true })
	if !errors.Is(err, errPart) || !strings.Contains(err.Error(), "worker: ") {
		t.Fatalf("start: %v, want the part's error", err)
	}
	if !released {
		t.Fatal("a failed start did not release")
	}

	errStart := errors.New("listen: address in use")
	l = newLife()
	l.part("server", func() error { <-l.ctx.Done(); return nil })
	if err := l.begin(errStart, func() {}, func() {}); err != errStart {
		t.Fatalf("start: %v, want %v", err, errStart)
	}
	if err := l.Wait(); err != nil {
		t.Fatalf("Wait after a failed start with no failed part: %v", err)
	}
}
