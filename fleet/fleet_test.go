package fleet

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
			fl := New()
			for _, b := range tt.beats {
				fl.Observe(b, now)
			}
			id, serving, ok := fl.Acquire(tt.model, tt.exclude)
			if id != tt.want || serving != tt.serving || ok != tt.ok {
				t.Fatalf("Acquire = %q, %d, %v; want %q, %d, %v", id, serving, ok, tt.want, tt.serving, tt.ok)
			}
		})
	}
}

func TestAcquireCountsAndSpreads(t *testing.T) {
	fl := New()
	fl.Observe(hb("a", 0, 3, "m"), time.Now())
	fl.Observe(hb("b", 0, 3, "m"), time.Now())
	got := map[string]int{}
	for range 6 {
		id, _, ok := fl.Acquire("m", "")
		if !ok {
			t.Fatal("ran out of capacity early")
		}
		got[id]++
	}
	if got["a"] != 3 || got["b"] != 3 {
		t.Fatalf("spread %v, want 3 each", got)
	}
	if _, _, ok := fl.Acquire("m", ""); ok {
		t.Fatal("acquired past capacity")
	}
	fl.Finished("a", 1)
	if id, _, ok := fl.Acquire("m", ""); !ok || id != "a" {
		t.Fatalf("after a done notice: %q %v", id, ok)
	}
	fl.MarkFull("a")
	fl.Finished("b", 2)
	if id, _, _ := fl.Acquire("m", ""); id != "b" {
		t.Fatalf("a bounced, so b should get it, got %q", id)
	}

	// With capacity to spare, a first-fit choice would pile onto one worker.
	fl = New()
	fl.Observe(hb("a", 0, 10, "m"), time.Now())
	fl.Observe(hb("b", 0, 10, "m"), time.Now())
	got = map[string]int{}
	for range 6 {
		id, _, ok := fl.Acquire("m", "")
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
	fl := New()
	t0 := time.Now()
	fl.Observe(hb("a", 0, 1, "m"), t0)
	fl.Observe(hb("b", 0, 1, "m"), t0.Add(2500*time.Millisecond))
	if gone := fl.Expire(t0.Add(2900 * time.Millisecond)); len(gone) != 0 {
		t.Fatalf("expired too early: %v", gone)
	}
	gone := fl.Expire(t0.Add(3100 * time.Millisecond))
	if len(gone) != 1 || gone[0] != "a" {
		t.Fatalf("gone %v, want [a]", gone)
	}
	if fl.Len() != 1 || fl.Serving("m") != 1 {
		t.Fatalf("len %d serving %d", fl.Len(), fl.Serving("m"))
	}
}

// While the owner is deaf (Blind) and for ReconnectGrace after, no worker
// expires; then one still unheard does.
func TestBlindThenGrace(t *testing.T) {
	fl := New()
	t0 := time.Now()
	fl.Observe(hb("a", 0, 1, "m"), t0) // interval 1s: gone after 3s of silence
	blind := t0.Add(5 * time.Second)   // disconnected from 5 s to 6 s
	fl.Blind(blind)
	fl.Blind(blind.Add(time.Second))
	back := blind.Add(time.Second)
	if gone := fl.Expire(back.Add(ReconnectGrace - time.Millisecond)); len(gone) != 0 {
		t.Fatalf("expired within the grace after the reconnect: %v", gone)
	}
	if gone := fl.Expire(back.Add(3100 * time.Millisecond)); len(gone) != 1 {
		t.Fatalf("a worker unheard past the grace and its beats: %v, want it gone", gone)
	}
}

func TestObserveIgnoresOlderBeat(t *testing.T) {
	fl := New()
	h := hb("a", 1, 4, "m")
	h.Seq = 10
	fl.Observe(h, time.Now())
	old := hb("a", 3, 4, "x")
	old.Seq = 9
	fl.Observe(old, time.Now())
	if fl.Serving("m") != 1 || fl.Serving("x") != 0 {
		t.Fatal("an older heartbeat overwrote a newer one")
	}
}

// BenchmarkAcquire is one routing decision (least-loaded choice and count)
// over a fleet of 64 workers of one model.
func BenchmarkAcquire(b *testing.B) {
	fl := New()
	now := time.Now()
	for i := range 64 {
		fl.Observe(hb(fmt.Sprintf("w%02d", i), i%7, 1<<30, "m"), now)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := fl.Acquire("m", ""); !ok {
			b.Fatal("no worker")
		}
	}
}
