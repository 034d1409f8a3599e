package dispatcher

import (
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// A request sent again counts once only after an attempt that failed on a
// worker it excludes; a finished attempt, or another worker, makes the
// resend a new request.
func TestFailuresDecideResends(t *testing.T) {
	var f failures
	f.record(schemas.DoneNotice{Worker: "w1", RequestID: "r1", Failed: true})
	f.record(schemas.DoneNotice{Worker: "w1", RequestID: "r2"})
	f.record(schemas.DoneNotice{Worker: "w2", RequestID: "r3", Failed: true})
	f.record(schemas.DoneNotice{Worker: "w2", RequestID: "r3"}) // sent again, finished
	for _, tc := range []struct {
		id, exclude string
		want        bool
	}{
		{"r1", "w1", true},
		{"r1", "w0,w1", true},
		{"r1", "w2", false}, // not the worker that failed it
		{"r1", "", false},
		{"r2", "w1", false}, // it finished
		{"r3", "w2", false}, // its last attempt finished
		{"r4", "w1", false}, // never seen
	} {
		if got := f.failedOn(tc.id, tc.exclude); got != tc.want {
			t.Errorf("failedOn(%q, %q) = %v, want %v", tc.id, tc.exclude, got, tc.want)
		}
	}
}

// The table is bounded: the oldest failures are forgotten first.
func TestFailuresBounded(t *testing.T) {
	var f failures
	for i := range maxFailures + 10 {
		f.record(schemas.DoneNotice{Worker: "w", RequestID: string(rune('a'+i%26)) + string(rune(i)), Failed: true})
	}
	if n := len(f.byID); n > maxFailures {
		t.Fatalf("%d failures held, bound %d", n, maxFailures)
	}
}

// A continuation that arrives before its failed done notice waits for it,
// briefly; a second one meanwhile does not wait, and a notice that never
// comes costs the wait's bound.
func TestFailuresAwait(t *testing.T) {
	var f failures
	got := make(chan bool, 1)
	go func() { got <- f.await("r1", "w1", 5*time.Second) }()
	for !f.waiting.Load() {
		time.Sleep(time.Millisecond) // until the first await holds the slot
	}
	start := time.Now()
	if f.await("r2", "w1", 5*time.Second) {
		t.Fatal("a second await waited and succeeded")
	}
	if time.Since(start) > time.Second {
		t.Fatal("a second await waited")
	}
	f.record(schemas.DoneNotice{Worker: "w2", RequestID: "r1", Failed: true}) // another worker: not it
	f.record(schemas.DoneNotice{Worker: "w1", RequestID: "r1", Failed: true})
	if !<-got {
		t.Fatal("the await missed the failed done notice")
	}
	start = time.Now()
	if f.await("r3", "w1", 50*time.Millisecond) || time.Since(start) < 50*time.Millisecond {
		t.Fatal("an await for a notice that never comes")
	}
}
