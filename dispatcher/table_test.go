package dispatcher

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

func hb(id string, running, max int, models ...string) schemas.Heartbeat {
	return schemas.Heartbeat{Worker: id, Models: models, MaxConcurrency: max, Running: running, Healthy: true, IntervalMS: 1000}
}

func TestAcquireLeastLoaded(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name    string
		beats   []schemas.Heartbeat
		model   string
		exclude string
		want    string
		serving int
		ok      bool
	}{
		{"least loaded wins", []schemas.Heartbeat{hb("a", 5, 10, "m"), hb("b", 2, 10, "m")}, "m", "", "b", 2, true},
		{"ratio, not count", []schemas.Heartbeat{hb("a", 5, 100, "m"), hb("b", 2, 4, "m")}, "m", "", "a", 2, true},
		{"full workers skipped", []schemas.Heartbeat{hb("a", 10, 10, "m"), hb("b", 9, 10, "m")}, "m", "", "b", 2, true},
		{"all full", []schemas.Heartbeat{hb("a", 10, 10, "m")}, "m", "", "", 1, false},
		{"other model", []schemas.Heartbeat{hb("a", 0, 10, "x")}, "m", "", "", 0, false},
		{"excluded", []schemas.Heartbeat{hb("a", 0, 10, "m"), hb("b", 5, 10, "m")}, "m", "a", "b", 2, true},
		{"draining skipped", []schemas.Heartbeat{func() schemas.Heartbeat { h := hb("a", 0, 10, "m"); h.Draining = true; return h }()}, "m", "", "", 0, false},
		{"unhealthy skipped", []schemas.Heartbeat{func() schemas.Heartbeat { h := hb("a", 0, 10, "m"); h.Healthy = false; return h }()}, "m", "", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := NewTable()
			for _, b := range tt.beats {
				tb.Observe(b, now)
			}
			id, serving, ok := tb.Acquire(tt.model, tt.exclude)
			if id != tt.want || serving != tt.serving || ok != tt.ok {
				t.Fatalf("Acquire = %q, %d, %v; want %q, %d, %v", id, serving, ok, tt.want, tt.serving, tt.ok)
			}
		})
	}
}

func TestAcquireCountsAndSpreads(t *testing.T) {
	tb := NewTable()
	tb.Observe(hb("a", 0, 3, "m"), time.Now())
	tb.Observe(hb("b", 0, 3, "m"), time.Now())
	got := map[string]int{}
	for range 6 {
		id, _, ok := tb.Acquire("m", "")
		if !ok {
			t.Fatal("ran out of capacity early")
		}
		got[id]++
	}
	if got["a"] != 3 || got["b"] != 3 {
		t.Fatalf("spread %v, want 3 each", got)
	}
	if _, _, ok := tb.Acquire("m", ""); ok {
		t.Fatal("acquired past capacity")
	}
	tb.Finished("a", 1)
	if id, _, ok := tb.Acquire("m", ""); !ok || id != "a" {
		t.Fatalf("after a done notice: %q %v", id, ok)
	}
	tb.MarkFull("a")
	tb.Finished("b", 2)
	if id, _, _ := tb.Acquire("m", ""); id != "b" {
		t.Fatalf("a bounced, so b should get it, got %q", id)
	}

	// With capacity to spare, a first-fit choice would pile onto one worker.
	tb = NewTable()
	tb.Observe(hb("a", 0, 10, "m"), time.Now())
	tb.Observe(hb("b", 0, 10, "m"), time.Now())
	got = map[string]int{}
	for range 6 {
		id, _, ok := tb.Acquire("m", "")
		if !ok {
			t.Fatal("ran out of capacity early")
		}
		got[id]++
	}
	if got["a"] != 3 || got["b"] != 3 {
		t.Fatalf("spread with spare capacity %v, want 3 each", got)
	}
}

func TestExpireAfterMissedBeats(t *testing.T) {
	tb := NewTable()
	t0 := time.Now()
	tb.Observe(hb("a", 0, 1, "m"), t0)
	tb.Observe(hb("b", 0, 1, "m"), t0.Add(2500*time.Millisecond))
	if gone := tb.Expire(t0.Add(2900 * time.Millisecond)); len(gone) != 0 {
		t.Fatalf("expired too early: %v", gone)
	}
	gone := tb.Expire(t0.Add(3100 * time.Millisecond))
	if len(gone) != 1 || gone[0] != "a" {
		t.Fatalf("gone %v, want [a]", gone)
	}
	if tb.Len() != 1 || tb.Serving("m") != 1 {
		t.Fatalf("len %d serving %d", tb.Len(), tb.Serving("m"))
	}
}

func TestObserveIgnoresOlderBeat(t *testing.T) {
	tb := NewTable()
	h := hb("a", 1, 4, "m")
	h.Seq = 10
	tb.Observe(h, time.Now())
	old := hb("a", 3, 4, "x")
	old.Seq = 9
	tb.Observe(old, time.Now())
	if tb.Serving("m") != 1 || tb.Serving("x") != 0 {
		t.Fatal("an older heartbeat overwrote a newer one")
	}
}

func TestQueueOrder(t *testing.T) {
	q := &modelQueue{}
	in := []struct {
		id  string
		pri int
	}{{"a", 0}, {"b", 5}, {"c", -1}, {"d", 0}, {"e", 5}}
	items := map[string]*queued{}
	for i, x := range in {
		e := &queued{id: x.id, priority: x.pri, seq: uint64(i)}
		items[x.id] = e
		q.push(e)
	}
	q.remove(items["d"])
	var got string
	for q.Len() > 0 {
		got += q.pop().id
	}
	if got != "cabe" {
		t.Fatalf("order %q, want cabe (priority, then FIFO; d removed)", got)
	}
}

// BenchmarkAcquire is one routing decision (least-loaded choice and count)
// over a table of 64 workers of one model.
func BenchmarkAcquire(b *testing.B) {
	tb := NewTable()
	now := time.Now()
	for i := range 64 {
		tb.Observe(hb(fmt.Sprintf("w%02d", i), i%7, 1<<30, "m"), now)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := tb.Acquire("m", ""); !ok {
			b.Fatal("no worker")
		}
	}
}
