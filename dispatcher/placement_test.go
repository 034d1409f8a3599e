package dispatcher

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

// pw is a worker of base "b" with maxLoras slots holding adapters.
func pw(id string, load, maxLoras int, adapters ...string) fleet.Worker {
	return fleet.Worker{Heartbeat: schemas.Heartbeat{Worker: id, Models: append([]string{"b"}, adapters...),
		Adapters: adapters, MaxLoras: maxLoras, MaxConcurrency: 10, Healthy: true}, Load: load}
}

func ad(name string, rate float64) adapterDemand {
	return adapterDemand{name: name, base: "b", path: "/loras/" + name, rate: rate}
}

func (a placeAction) String() string {
	op := "unload"
	if a.load {
		op = "load"
	}
	s := op + " " + a.adapter.name + "@" + a.worker
	if a.evict != "" {
		s += " evict " + a.evict
	}
	return s
}

func TestDecide(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := PlacementConfig{}
	cfg.defaults() // up 4, down 1, 30s
	recent := func(a adapterDemand) adapterDemand { a.changed = now.Add(-10 * time.Second); return a }
	long := func(a adapterDemand) adapterDemand { a.changed = now.Add(-time.Minute); return a }
	draining := pw("w3", 0, 4)
	draining.Draining = true
	for _, tc := range []struct {
		name    string
		demand  []adapterDemand
		workers []fleet.Worker
		want    []string
	}{
		{"hot adapter replicated to the idlest worker with a free slot",
			[]adapterDemand{ad("x", 10)},
			[]fleet.Worker{pw("w1", 5, 4, "x"), pw("w2", 3, 4), pw("w3", 1, 4)},
			[]string{"load x@w3"}},
		{"most free slots first",
			[]adapterDemand{ad("x", 10)},
			[]fleet.Worker{pw("w1", 5, 4, "x"), pw("w2", 0, 4, "p", "q"), pw("w3", 9, 4)},
			[]string{"load x@w3"}},
		{"one replica per decision",
			[]adapterDemand{ad("x", 100)},
			[]fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4), pw("w3", 0, 4)},
			[]string{"load x@w2"}},
		{"hot but enough replicas: nothing",
			[]adapterDemand{ad("x", 7.9)},
			[]fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4, "x"), pw("w3", 0, 4)},
			nil},
		{"cold adapter with one replica: left to the worker's LRU",
			[]adapterDemand{ad("x", 0.01)},
			[]fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4)},
			nil},
		{"nobody holds it: the first request loads it, not placement",
			[]adapterDemand{ad("x", 50)},
			[]fleet.Worker{pw("w1", 0, 4), pw("w2", 0, 4)},
			nil},
		{"cold spare replica unloaded from the highest id",
			[]adapterDemand{ad("x", 0.5)},
			[]fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4, "x")},
			[]string{"unload x@w2"}},
		{"hysteresis band: between down and up with 2 replicas, nothing",
			[]adapterDemand{ad("x", 3)}, // 1.5/replica now, 3 on one: neither above 4 nor below 1
			[]fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4, "x")},
			nil},
		{"hysteresis in time: changed 10s ago, nothing",
			[]adapterDemand{recent(ad("x", 10)), recent(ad("y", 0.1))},
			[]fleet.Worker{pw("w1", 0, 4, "x", "y"), pw("w2", 0, 4, "y")},
			nil},
		{"changed a minute ago: may change again",
			[]adapterDemand{long(ad("x", 10))},
			[]fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4)},
			[]string{"load x@w2"}},
		{"full slots: the coldest adapter makes way",
			[]adapterDemand{ad("x", 20), ad("p", 0.5), ad("q", 0.2), ad("r", 3)},
			[]fleet.Worker{pw("w1", 0, 2, "x", "r"), pw("w2", 0, 2, "p", "q")},
			[]string{"load x@w2 evict q"}},
		{"full slots, nothing cold: nothing",
			[]adapterDemand{ad("x", 20), ad("p", 2), ad("q", 2)},
			[]fleet.Worker{pw("w1", 0, 1, "x"), pw("w2", 0, 2, "p", "q")},
			nil},
		{"full slots: an adapter we never saw counts as cold",
			[]adapterDemand{ad("x", 20), ad("p", 2)},
			[]fleet.Worker{pw("w1", 0, 1, "x"), pw("w2", 0, 2, "p", "other")},
			[]string{"load x@w2 evict other"}},
		{"a loading adapter takes a slot and is never evicted",
			[]adapterDemand{ad("x", 20)},
			[]fleet.Worker{pw("w1", 0, 1, "x"), {Heartbeat: schemas.Heartbeat{Worker: "w2", Models: []string{"b"},
				Loading: []string{"l"}, MaxLoras: 1, MaxConcurrency: 10, Healthy: true}}},
			nil},
		{"draining, unhealthy and other-base workers are not candidates",
			[]adapterDemand{ad("x", 20)},
			[]fleet.Worker{pw("w1", 0, 4, "x"), draining,
				{Heartbeat: schemas.Heartbeat{Worker: "w4", Models: []string{"other"}, MaxLoras: 4, Healthy: true}},
				{Heartbeat: schemas.Heartbeat{Worker: "w5", Models: []string{"b"}, MaxLoras: 4}}},
			nil},
		{"hottest first gets the last free slot",
			[]adapterDemand{ad("x", 10), ad("y", 30)},
			[]fleet.Worker{pw("w1", 0, 2, "x", "y"), pw("w2", 0, 1)},
			[]string{"load y@w2"}},
		{"a replica a hot adapter just got is not unloaded in the same decision",
			[]adapterDemand{ad("x", 10), ad("c", 0.1)},
			[]fleet.Worker{pw("w1", 0, 2, "x", "c"), pw("w2", 0, 2, "c")},
			[]string{"load x@w2", "unload c@w2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, a := range decide(cfg, now, slices.Clone(tc.demand), tc.workers) {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("decide = %q, want %q", got, tc.want)
			}
		})
	}
}

// A replica added at just above Up must not make the adapter removable at
// the next decision: Down is capped at Up/2.
func TestDecideNoFlap(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := PlacementConfig{Up: 4, Down: 3, MinInterval: time.Nanosecond}
	cfg.defaults()
	if cfg.Down != 2 {
		t.Fatalf("Down = %v, want capped at 2", cfg.Down)
	}
	ws := []fleet.Worker{pw("w1", 0, 4, "x"), pw("w2", 0, 4)}
	acts := decide(cfg, now, []adapterDemand{ad("x", 4.1)}, ws)
	if len(acts) != 1 || !acts[0].load {
		t.Fatalf("want one load, got %v", acts)
	}
	ws[1] = pw("w2", 0, 4, "x")
	if acts := decide(cfg, now.Add(time.Second), []adapterDemand{ad("x", 4.1)}, ws); len(acts) != 0 {
		t.Fatalf("flapped: %v", acts)
	}
}

func TestDemandRate(t *testing.T) {
	cfg := PlacementConfig{HalfLife: 10 * time.Second, MaxAdapters: 2}
	cfg.defaults()
	d := newDemand(cfg)
	t0 := time.Unix(1000, 0)
	ref := &adapterRef{base: "b", path: "/p"}
	// 5 requests/s for a minute: the rate tends to 5.
	for i := range 300 {
		d.observe("x", ref, t0.Add(time.Duration(i)*200*time.Millisecond))
	}
	end := t0.Add(60 * time.Second)
	rate := func(name string, at time.Time) float64 {
		for _, a := range d.snapshot(at) {
			if a.name == name {
				return a.rate
			}
		}
		return -1
	}
	if r := rate("x", end); math.Abs(r-5) > 0.5 {
		t.Fatalf("rate after a minute at 5/s = %v", r)
	}
	if r := rate("x", end.Add(10*time.Second)); math.Abs(r-2.5) > 0.3 {
		t.Fatalf("rate a half-life later = %v, want about 2.5", r)
	}
	// Bounded: a third adapter drops the coldest.
	d.observe("y", ref, end)
	d.observe("z", ref, end)
	names := []string{}
	for _, a := range d.snapshot(end) {
		names = append(names, a.name)
	}
	slices.Sort(names)
	if fmt.Sprint(names) != "[x z]" {
		t.Fatalf("tracked %v, want [x z]", names)
	}
}
