package fleet

import (
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

func roleHB(id, role string, running, max int) schemas.Heartbeat {
	h := hb(id, running, max, "m")
	h.Role = role
	return h
}

func TestPrefillWorkersServeOnlyPrefills(t *testing.T) {
	now := time.Now()
	fl := New()
	fl.Observe(roleHB("p1", schemas.RolePrefill, 0, 4), now)
	fl.Observe(roleHB("p2", schemas.RolePrefill, 3, 4), now)
	fl.Observe(roleHB("d1", schemas.RoleDecode, 3, 4), now)
	if n := fl.Serving("m"); n != 1 {
		t.Fatalf("Serving counts prefill workers: %d", n)
	}
	for range 3 { // d1 has one slot: the idle prefill workers are never chosen
		id, serving, ok := fl.Acquire("m", "")
		if ok && id != "d1" || serving != 1 {
			t.Fatalf("Acquire = %q, %d, %v", id, serving, ok)
		}
	}
	tests := []struct {
		exclude, want string
		ok            bool
	}{
		{"", "p1", true},   // 0 of 4 against 3 of 4
		{"p1", "p2", true}, // excluded: p2 takes its last slot
		{"", "p1", true},
		{"", "p1", true},
		{"", "p1", true}, // p1's last slot
		{"", "", false},  // both full
	}
	for i, tc := range tests {
		id, live, _, ok := fl.AcquirePrefill("m", tc.exclude, nil)
		if live != 2 || ok != tc.ok || id != tc.want {
			t.Fatalf("pick %d: AcquirePrefill = %q, %d, %v; want %q, %v", i, id, live, ok, tc.want, tc.ok)
		}
	}
	fl.Release("p1")
	if id, _, _, ok := fl.AcquirePrefill("m", "", nil); !ok || id != "p1" {
		t.Fatalf("after Release: %q, %v", id, ok)
	}
	if _, live, _, ok := fl.AcquirePrefill("other", "", nil); ok || live != 0 {
		t.Fatal("a prefill worker of another model was chosen")
	}
}

func TestAcquirePrefillPrefersCachedPrompt(t *testing.T) {
	now := time.Now()
	fl := New()
	fl.Observe(roleHB("p1", schemas.RolePrefill, 0, 8), now)
	fl.Observe(roleHB("p2", schemas.RolePrefill, 0, 8), now)
	hashes := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	first, _, _, _ := fl.AcquirePrefill("m", "", hashes)
	for range 3 {
		id, _, cached, _ := fl.AcquirePrefill("m", "", hashes)
		if id != first || cached != len(hashes) {
			t.Fatalf("went to %q (cached %d), not to %q which holds the prompt", id, cached, first)
		}
	}
}

// A request for an adapter never lands on a prefill worker, also not
// through the eviction pass, which picks the worker whose coldest adapter
// is coldest: here the prefill worker's.
func TestAdapterNeverOnPrefillWorker(t *testing.T) {
	now := time.Now()
	fl := New()
	fl.AdapterRate = func(a string, _ time.Time) float64 { return map[string]float64{"hot": 10, "cold": 0.1}[a] }
	full := func(h schemas.Heartbeat, adapter string) schemas.Heartbeat {
		h.Adapters, h.Models, h.MaxLoras = []string{adapter}, []string{"m", adapter}, 1 // its one slot taken
		return h
	}
	fl.Observe(full(roleHB("d1", schemas.RoleDecode, 0, 8), "hot"), now)
	fl.Observe(full(roleHB("p1", schemas.RolePrefill, 0, 8), "cold"), now)
	if id, serving, how, ok := fl.AcquireAdapter("y", "m", "", now); !ok || id != "d1" || serving != 1 || how != PlacedEvict {
		t.Fatalf("AcquireAdapter = %q, %d, %v, %v; want d1, which evicts", id, serving, how, ok)
	}
}
