package fleet

import (
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// asleep is hb for a worker whose engine sleeps.
func asleep(h schemas.Heartbeat) schemas.Heartbeat { h.Sleeping = true; return h }

// A sleeping worker is capacity a wake-up away: chosen only when no awake
// worker has room, whatever its load or prefix score.
func TestAcquirePrefersAwake(t *testing.T) {
	now := time.Now()
	prompt := []uint64{1, 2, 3, 4}
	tests := []struct {
		name    string
		beats   []schemas.Heartbeat
		hashes  []uint64
		cached  string // a worker our record says holds the prompt
		want    string
		serving int
		ok      bool
	}{
		{"an idle sleeper loses to a busy awake worker",
			[]schemas.Heartbeat{asleep(hb("s", 0, 10, "m")), hb("a", 9, 10, "m")}, nil, "", "a", 2, true},
		{"a full awake worker: the sleeper",
			[]schemas.Heartbeat{asleep(hb("s", 0, 10, "m")), hb("a", 10, 10, "m")}, nil, "", "s", 2, true},
		{"the least-loaded sleeper when every awake one is full",
			[]schemas.Heartbeat{asleep(hb("s1", 3, 10, "m")), asleep(hb("s2", 1, 10, "m")), hb("a", 10, 10, "m")}, nil, "", "s2", 3, true},
		{"a full sleeper is no room",
			[]schemas.Heartbeat{asleep(hb("s", 10, 10, "m")), hb("a", 10, 10, "m")}, nil, "", "", 2, false},
		{"only sleepers",
			[]schemas.Heartbeat{asleep(hb("s", 0, 10, "m"))}, nil, "", "s", 1, true},
		{"a cached prefix does not draw a request to a sleeper",
			[]schemas.Heartbeat{asleep(hb("s", 0, 10, "m")), hb("a", 8, 10, "m")}, prompt, "s", "a", 2, true},
		{"among awake workers the prefix score still decides",
			[]schemas.Heartbeat{asleep(hb("s", 0, 10, "m")), hb("a", 0, 10, "m"), hb("c", 2, 10, "m")}, prompt, "c", "c", 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := New()
			for _, b := range tt.beats {
				fl.Observe(b, now)
			}
			if tt.cached != "" {
				fl.mu.Lock()
				fl.recordLocked(fl.workers[tt.cached], tt.hashes)
				fl.mu.Unlock()
			}
			id, serving, _, ok := fl.AcquirePrefix("m", "", tt.hashes)
			if id != tt.want || serving != tt.serving || ok != tt.ok {
				t.Fatalf("AcquirePrefix = %q, %d, %v; want %q, %d, %v", id, serving, ok, tt.want, tt.serving, tt.ok)
			}
		})
	}
}

func TestAcquireAdapterPrefersAwake(t *testing.T) {
	now := time.Now()
	none := []string(nil)
	sleeping := func(w lw) schemas.Heartbeat { return asleep(w.beat()) }
	tests := []struct {
		name    string
		beats   []schemas.Heartbeat
		want    string
		how     Placement
		serving int
		ok      bool
	}{
		{"an awake worker that must evict beats a sleeping holder",
			[]schemas.Heartbeat{sleeping(lw{"s", 0, 10, 1, []string{"x"}, none}), lw{"a", 5, 10, 1, []string{"y"}, none}.beat()},
			"a", PlacedEvict, 2, true},
		{"an awake free slot beats a sleeping holder",
			[]schemas.Heartbeat{sleeping(lw{"s", 0, 10, 4, []string{"x"}, none}), lw{"a", 9, 10, 4, none, none}.beat()},
			"a", PlacedFreeSlot, 2, true},
		{"awake ones full: the sleeping holder",
			[]schemas.Heartbeat{sleeping(lw{"s", 0, 10, 4, []string{"x"}, none}), sleeping(lw{"t", 0, 10, 4, none, none}),
				lw{"a", 10, 10, 4, []string{"x"}, none}.beat()},
			"s", PlacedHolder, 3, true},
		{"awake ones full, no sleeping holder: a sleeper's free slot",
			[]schemas.Heartbeat{sleeping(lw{"t", 0, 10, 4, none, none}), lw{"a", 10, 10, 4, []string{"x"}, none}.beat()},
			"t", PlacedFreeSlot, 2, true},
		{"everyone full",
			[]schemas.Heartbeat{sleeping(lw{"t", 10, 10, 4, none, none}), lw{"a", 10, 10, 4, []string{"x"}, none}.beat()},
			"", 0, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := New()
			for _, b := range tt.beats {
				fl.Observe(b, now)
			}
			id, serving, how, ok := fl.AcquireAdapter("x", "b", "", now)
			if id != tt.want || serving != tt.serving || ok != tt.ok || ok && how != tt.how {
				t.Fatalf("AcquireAdapter = %q, %d, %v, %v; want %q, %d, %v, %v", id, serving, how, ok, tt.want, tt.serving, tt.how, tt.ok)
			}
		})
	}
}

// With AdapterRate set, a load that must evict is placed by the coldest
// victim, but still among the awake workers first.
func TestAcquireAdapterEvictionPrefersAwake(t *testing.T) {
	now := time.Now()
	none := []string(nil)
	fl := New()
	fl.AdapterRate = func(a string, _ time.Time) float64 { return map[string]float64{"cold": 0.1, "warm": 5}[a] }
	fl.Observe(asleep(lw{"s", 0, 10, 1, []string{"cold"}, none}.beat()), now)
	fl.Observe(lw{"a", 3, 10, 1, []string{"warm"}, none}.beat(), now)
	if id, _, how, ok := fl.AcquireAdapter("x", "b", "", now); !ok || id != "a" || how != PlacedEvict {
		t.Fatalf("AcquireAdapter = %q, %v, %v; want the awake a to evict", id, how, ok)
	}
}
