package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	p := Default
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, 400},
		{4 << 20, 400},   // tiny heap: the largest GOGC
		{16 << 20, 400},  // 64 MiB headroom is 400 % of 16 MiB
		{32 << 20, 200},  // 64 MiB is 200 % of 32 MiB
		{64 << 20, 100},  // and 100 % of 64 MiB
		{512 << 20, 100}, // never below Go's default
	} {
		if got := p.Percent(tc.live); got != tc.want {
			t.Errorf("Percent(%d MiB) = %d, want %d", tc.live>>20, got, tc.want)
		}
	}
}

// After every collection the tuner sets GOGC from the live heap (here far
// below the headroom: the largest).
func TestStartTunes(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	Start(Policy{Headroom: 1 << 40, MinPercent: 100, MaxPercent: 333})
	for range 3 {
		// As if the live heap had called for 100: the next collection
		// sets GOGC again.
		active.set(100)
		deadline := time.Now().Add(5 * time.Second)
		for active.percent.Load() != 333 {
			if time.Now().After(deadline) {
				t.Fatalf("GOGC stayed %d after collections; want 333", active.percent.Load())
			}
			runtime.GC()
			time.Sleep(time.Millisecond) // the finalizer runs on its own goroutine
		}
		if cur := debug.SetGCPercent(333); cur != 333 {
			t.Fatalf("the runtime's GOGC is %d; want 333", cur)
		}
	}
}
