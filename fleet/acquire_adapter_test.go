package fleet

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// lw is a heartbeat of a worker serving base model "b" with LoRA slots.
type lw struct {
	id                string
	running, max      int
	maxLoras          int
	adapters, loading []string
}

func (w lw) beat() schemas.Heartbeat {
	h := hb(w.id, w.running, w.max, append([]string{"b"}, w.adapters...)...)
	h.Adapters, h.Loading, h.MaxLoras = w.adapters, w.loading, w.maxLoras
	return h
}

func TestAcquireAdapterScoring(t *testing.T) {
	now := time.Now()
	none := []string(nil)
	tests := []struct {
		name    string
		workers []lw
		extra   []schemas.Heartbeat // other workers, as raw heartbeats
		exclude string
		want    string
		how     Placement
		serving int
		ok      bool
	}{
		{"holder beats an idle worker with a free slot",
			[]lw{{"a", 3, 10, 4, []string{"x"}, none}, {"c", 0, 10, 4, none, none}}, nil, "", "a", PlacedHolder, 2, true},
		{"holder much busier: spill to a free slot",
			[]lw{{"a", 6, 10, 4, []string{"x"}, none}, {"c", 0, 10, 4, none, none}}, nil, "", "c", PlacedFreeSlot, 2, true},
		{"least-loaded holder among holders",
			[]lw{{"a", 5, 10, 4, []string{"x"}, none}, {"c", 2, 10, 4, []string{"x"}, none}, {"d", 0, 10, 4, none, none}}, nil, "", "c", PlacedHolder, 3, true},
		{"a worker loading it is a holder",
			[]lw{{"a", 2, 10, 4, none, []string{"x"}}, {"c", 0, 10, 4, none, none}}, nil, "", "a", PlacedHolder, 2, true},
		{"holder never passed over for a worker that must evict",
			[]lw{{"a", 9, 10, 1, []string{"x"}, none}, {"c", 0, 10, 1, []string{"y"}, none}}, nil, "", "a", PlacedHolder, 2, true},
		{"full holder: a free slot elsewhere",
			[]lw{{"a", 10, 10, 4, []string{"x"}, none}, {"c", 7, 10, 4, []string{"y"}, none}}, nil, "", "c", PlacedFreeSlot, 2, true},
		{"no holder: free slot beats a less-loaded worker with full slots",
			[]lw{{"a", 1, 10, 1, []string{"y"}, none}, {"c", 5, 10, 2, []string{"y"}, none}}, nil, "", "c", PlacedFreeSlot, 2, true},
		{"loads in progress take slots",
			[]lw{{"a", 0, 10, 2, []string{"y"}, []string{"z"}}, {"c", 5, 10, 2, none, none}}, nil, "", "c", PlacedFreeSlot, 2, true},
		{"every slot full: least-loaded evicts",
			[]lw{{"a", 3, 10, 1, []string{"y"}, none}, {"c", 1, 10, 1, []string{"z"}, none}}, nil, "", "c", PlacedEvict, 2, true},
		{"no slot limit counts as free",
			[]lw{{"a", 1, 10, 0, []string{"y", "z"}, none}}, nil, "", "a", PlacedFreeSlot, 1, true},
		{"excluded holder: the other worker",
			[]lw{{"a", 0, 10, 4, []string{"x"}, none}, {"c", 5, 10, 4, none, none}}, nil, "a", "c", PlacedFreeSlot, 2, true},
		{"everyone full", []lw{{"a", 10, 10, 4, []string{"x"}, none}}, nil, "", "", 0, 1, false},
		{"base served by nobody", nil, []schemas.Heartbeat{hb("o", 0, 10, "other")}, "", "", 0, 0, false},
		{"a worker serving the adapter name itself is a holder",
			[]lw{{"c", 0, 10, 4, none, none}}, []schemas.Heartbeat{hb("s", 3, 10, "x")}, "", "s", PlacedHolder, 2, true},
		{"draining and unhealthy workers skipped", nil, []schemas.Heartbeat{
			func() schemas.Heartbeat { h := hb("a", 0, 10, "b"); h.Draining = true; return h }(),
			func() schemas.Heartbeat { h := hb("c", 0, 10, "b"); h.Healthy = false; return h }()}, "", "", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := New()
			for _, w := range tt.workers {
				fl.Observe(w.beat(), now)
			}
			for _, h := range tt.extra {
				fl.Observe(h, now)
			}
			id, serving, how, ok := fl.AcquireAdapter("x", "b", tt.exclude, now)
			if id != tt.want || serving != tt.serving || ok != tt.ok || ok && how != tt.how {
				t.Fatalf("AcquireAdapter = %q, %d, %v, %v; want %q, %d, %v, %v", id, serving, how, ok, tt.want, tt.serving, tt.how, tt.ok)
			}
			if got := fl.Pending("x"); ok && tt.how != PlacedHolder && !slices.Equal(got, []string{tt.want}) {
				t.Fatalf("pending %v, want [%s]", got, tt.want)
			}
			if serving != fl.ServingAdapter("x", "b") {
				t.Fatalf("ServingAdapter %d, AcquireAdapter's serving %d", fl.ServingAdapter("x", "b"), serving)
			}
		})
	}
}

// Concurrent first requests for an adapter, before any heartbeat tells of a
// load, all go to the worker that got the first one: one load, not one per
// worker.
func TestAcquireAdapterCoalescesPendingLoads(t *testing.T) {
	now := time.Now()
	fl := New()
	for _, id := range []string{"a", "c", "d"} {
		fl.Observe(lw{id, 0, 10, 4, nil, nil}.beat(), now)
	}
	first, _, how, _ := fl.AcquireAdapter("x", "b", "", now)
	if how != PlacedFreeSlot {
		t.Fatalf("first request: %v", how)
	}
	for i := range 4 {
		id, _, how, ok := fl.AcquireAdapter("x", "b", "", now)
		if !ok || id != first || how != PlacedHolder {
			t.Fatalf("request %d went to %s (%v), want %s as holder", i+2, id, how, first)
		}
	}
	// A pending load takes a slot: with one slot, another adapter goes elsewhere.
	fl2 := New()
	fl2.Observe(lw{"a", 0, 10, 1, nil, nil}.beat(), now)
	fl2.Observe(lw{"c", 3, 10, 1, nil, nil}.beat(), now)
	if id, _, how, _ := fl2.AcquireAdapter("x", "b", "", now); id != "a" || how != PlacedFreeSlot {
		t.Fatalf("x: %s %v", id, how)
	}
	if id, _, how, _ := fl2.AcquireAdapter("y", "b", "", now); id != "c" || how != PlacedFreeSlot {
		t.Fatalf("y: %s %v, want c: a's only slot is taken by the pending load of x", id, how)
	}
}

func TestAdapterPendingSettles(t *testing.T) {
	t0 := time.Now()
	tests := []struct {
		name     string
		beat     lw
		at       time.Duration
		pending  bool
		wantNext string // where the next request for x goes
	}{
		// A heartbeat sent before the worker got the request says nothing yet.
		{"early beat without it keeps the pending load", lw{"a", 1, 10, 4, nil, nil}, 100 * time.Millisecond, true, "a"},
		{"beat listing it as loading settles it", lw{"a", 1, 10, 4, nil, []string{"x"}}, 100 * time.Millisecond, false, "a"},
		{"beat listing it as loaded settles it", lw{"a", 1, 10, 4, []string{"x"}, nil}, 100 * time.Millisecond, false, "a"},
		// A beat a whole interval later without it: the load failed.
		{"late beat without it drops it", lw{"a", 6, 10, 4, nil, nil}, 1100 * time.Millisecond, false, "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := New()
			fl.Observe(lw{"a", 0, 10, 4, nil, nil}.beat(), t0)
			fl.Observe(lw{"c", 2, 10, 4, nil, nil}.beat(), t0)
			if id, _, _, _ := fl.AcquireAdapter("x", "b", "", t0); id != "a" {
				t.Fatalf("first went to %s", id)
			}
			fl.Observe(tt.beat.beat(), t0.Add(tt.at))
			if got := len(fl.Pending("x")) == 1; got != tt.pending {
				t.Fatalf("pending %v, want %v", fl.Pending("x"), tt.pending)
			}
			if id, _, _, _ := fl.AcquireAdapter("x", "b", "", t0.Add(tt.at)); id != tt.wantNext {
				t.Fatalf("next went to %s, want %s", id, tt.wantNext)
			}
		})
	}
	// A worker that goes away takes its pending loads with it.
	fl := New()
	fl.Observe(lw{"a", 0, 10, 4, nil, nil}.beat(), t0)
	fl.AcquireAdapter("x", "b", "", t0)
	fl.Remove("a", "test")
	if p := fl.Pending("x"); len(p) != 0 {
		t.Fatalf("pending after remove: %v", p)
	}
	fl.Observe(lw{"a", 0, 10, 4, nil, nil}.beat(), t0)
	fl.AcquireAdapter("x", "b", "", t0)
	fl.Expire(t0.Add(10 * time.Second))
	if p := fl.Pending("x"); len(p) != 0 {
		t.Fatalf("pending after expiry: %v", p)
	}
}

// With every slot full, a request for an adapter no one holds goes to the
// worker whose eviction victim (its coldest loaded adapter by AdapterRate)
// is coldest, then the least loaded.
func TestAcquireAdapterEvictsColdest(t *testing.T) {
	now := time.Now()
	rates := map[string]float64{"hot": 10, "warm": 1, "warm2": 1, "cold": 0.1, "cold2": 0.1}
	rate := func(a string, at time.Time) float64 {
		return rates[a] // not counted: 0
	}
	l := func(s ...string) []string { return s }
	tests := []struct {
		name    string
		workers []lw
		want    string
		how     Placement
	}{
		{"coldest victim beats the least loaded",
			[]lw{{"a", 0, 10, 1, l("hot"), nil}, {"c", 5, 10, 1, l("cold"), nil}}, "c", PlacedEvict},
		{"a worker's victim is its coldest adapter",
			[]lw{{"a", 0, 10, 2, l("warm", "warm2"), nil}, {"c", 5, 10, 2, l("cold", "hot"), nil}}, "c", PlacedEvict},
		{"equal victims: the least loaded",
			[]lw{{"a", 3, 10, 1, l("cold"), nil}, {"c", 1, 10, 1, l("cold2"), nil}}, "c", PlacedEvict},
		{"an adapter not counted is the coldest",
			[]lw{{"a", 0, 10, 1, l("cold"), nil}, {"c", 5, 10, 2, l("hot", "unknown"), nil}}, "c", PlacedEvict},
		{"an adapter loading is no victim (an engine may list it already)",
			[]lw{{"a", 0, 10, 2, l("cold", "hot"), l("cold")}, {"c", 5, 10, 2, l("warm", "warm2"), nil}}, "c", PlacedEvict},
		{"slots over-committed (a load under way evicts the coldest): the next coldest",
			[]lw{{"a", 0, 10, 2, l("cold", "hot"), l("new")}, {"c", 5, 10, 2, l("warm", "warm2"), nil}}, "c", PlacedEvict},
		{"nothing evictable anywhere: the least loaded",
			[]lw{{"a", 3, 10, 1, nil, l("y")}, {"c", 1, 10, 1, nil, l("z")}}, "c", PlacedEvict},
		{"a busy worker is no candidate however cold its victim",
			[]lw{{"a", 9, 10, 1, l("hot"), nil}, {"c", 10, 10, 1, l("cold"), nil}}, "a", PlacedEvict},
		{"a free slot still beats a cold victim",
			[]lw{{"a", 9, 10, 2, l("hot"), nil}, {"c", 0, 10, 1, l("cold"), nil}}, "a", PlacedFreeSlot},
		{"a holder still beats a cold victim",
			[]lw{{"a", 9, 10, 1, l("x"), nil}, {"c", 0, 10, 1, l("cold"), nil}}, "a", PlacedHolder},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := New()
			fl.AdapterRate = rate
			for _, w := range tt.workers {
				fl.Observe(w.beat(), now)
			}
			id, _, how, ok := fl.AcquireAdapter("x", "b", "", now)
			if !ok || id != tt.want || how != tt.how {
				t.Fatalf("AcquireAdapter = %q, %v, %v; want %q, %v", id, how, ok, tt.want, tt.how)
			}
		})
	}
	// Before any heartbeat shows it, a load sent to a worker takes its
	// coldest adapter's slot: the next load goes to the next coldest victim.
	fl := New()
	fl.AdapterRate = rate
	fl.Observe(lw{"a", 0, 10, 1, l("warm"), nil}.beat(), now)
	fl.Observe(lw{"c", 0, 10, 1, l("cold"), nil}.beat(), now)
	if id, _, how, _ := fl.AcquireAdapter("x", "b", "", now); id != "c" || how != PlacedEvict {
		t.Fatalf("x: %s %v, want c (evicting cold)", id, how)
	}
	if id, _, how, _ := fl.AcquireAdapter("y", "b", "", now); id != "a" || how != PlacedEvict {
		t.Fatalf("y: %s %v, want a: c's cold is already going for x", id, how)
	}

	// An adapter a request was just routed to is in use there (the worker
	// will not evict it) for AdapterBusyFor: the next load goes elsewhere,
	// until that has passed.
	fl = New()
	fl.AdapterRate = rate
	fl.Observe(lw{"a", 0, 10, 1, l("warm"), nil}.beat(), now)
	fl.Observe(lw{"c", 0, 10, 1, l("cold"), nil}.beat(), now)
	if id, _, how, _ := fl.AcquireAdapter("cold", "b", "", now); id != "c" || how != PlacedHolder {
		t.Fatalf("cold: %s %v", id, how)
	}
	if id, _, _, _ := fl.AcquireAdapter("x", "b", "", now.Add(fl.AdapterBusyFor/2)); id != "a" {
		t.Fatalf("x went to %s, want a: c's cold adapter is in use", id)
	}
	later := now.Add(2 * fl.AdapterBusyFor) // the pending load of x on a settles too
	fl.Observe(lw{"a", 0, 10, 1, l("warm"), nil}.beat(), later)
	fl.Observe(lw{"c", 0, 10, 1, l("cold"), nil}.beat(), later)
	if id, _, _, _ := fl.AcquireAdapter("y", "b", "", later); id != "c" {
		t.Fatalf("y went to %s, want c once its cold adapter is idle again", id)
	}

	// Every adapter seems in use: the coldest counting those still wins
	// over the least loaded (the worker will evict its coldest idle one).
	fl = New()
	fl.AdapterRate = rate
	fl.Observe(lw{"a", 0, 10, 1, l("warm"), nil}.beat(), now)
	fl.Observe(lw{"c", 3, 10, 1, l("cold"), nil}.beat(), now)
	for _, a := range []string{"warm", "cold"} {
		if _, _, how, _ := fl.AcquireAdapter(a, "b", "", now); how != PlacedHolder {
			t.Fatalf("%s: %v", a, how)
		}
	}
	if id, _, _, _ := fl.AcquireAdapter("x", "b", "", now); id != "c" {
		t.Fatalf("x went to %s, want c: all in use, and c's adapter is the colder", id)
	}
}

// An adapter a worker's heartbeat lists in use (InUse) is no victim however
// long ago we routed a request for it there (a long generation), and is one
// again once a heartbeat no longer lists it and the guess has passed.
func TestAdapterInUseFromHeartbeats(t *testing.T) {
	now := time.Now()
	l := func(s ...string) []string { return s }
	rate := func(a string, _ time.Time) float64 { return map[string]float64{"cold": 1, "warm": 5}[a] }
	beat := func(id string, adapters, inUse []string) schemas.Heartbeat {
		h := lw{id, 0, 10, 1, adapters, nil}.beat()
		h.InUse = inUse
		return h
	}
	fl := New()
	fl.AdapterRate = rate
	observe := func(at time.Time, inUse []string) {
		fl.Observe(beat("a", l("warm"), l()), at)
		fl.Observe(beat("c", l("cold"), inUse), at)
	}
	want := func(at time.Time, id, why string) {
		t.Helper()
		if got, _, how, _ := fl.AcquireAdapter("x", "b", "", at); got != id || how != PlacedEvict {
			t.Fatalf("x went to %s (%v), want %s: %s", got, how, id, why)
		}
	}
	observe(now, l())
	if id, _, how, _ := fl.AcquireAdapter("cold", "b", "", now); id != "c" || how != PlacedHolder {
		t.Fatalf("cold: %s %v", id, how)
	}
	later := now.Add(5 * fl.AdapterBusyFor) // past the guess; the request still runs
	observe(later, l("cold"))
	want(later, "a", "c's heartbeat says its cold adapter is in use")

	last := later.Add(5 * fl.AdapterBusyFor) // x's load on a settles
	observe(last, l())
	want(last, "c", "the heartbeat after the request no longer lists cold")
}

// BenchmarkAcquireAdapter is one routing decision for a LoRA adapter over 64
// workers of four full slots each: "holder" for an adapter one worker holds
// (the common case), "evict" for one no worker holds (every decision then
// evicts; the victims' rates are looked up).
func BenchmarkAcquireAdapter(b *testing.B) {
	for _, held := range []bool{true, false} {
		name := map[bool]string{true: "holder", false: "evict"}[held]
		b.Run(name, func(b *testing.B) {
			fl := New()
			fl.AdapterRate = func(adapter string, _ time.Time) float64 { return float64(len(adapter)) } // BENCH-RATE
			now := time.Now()
			for i := range 64 {
				as := make([]string, 4)
				for j := range as {
					as[j] = fmt.Sprintf("a%03d", i*4+j)
				}
				fl.Observe(lw{fmt.Sprintf("w%02d", i), i % 7, 1 << 30, 4, as, nil}.beat(), now)
			}
			adapter := "a000"
			if !held {
				adapter = "new"
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, ok := fl.AcquireAdapter(adapter, "b", "", now); !ok {
					b.Fatal("no worker")
				}
				if !held {
					delete(fl.pending, adapter) // or the next decision finds a holder
				}
			}
		})
	}
}
