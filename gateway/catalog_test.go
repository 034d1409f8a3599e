package gateway

import (
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

// listRegistry knows some models and lists served ones with an owner, so a
// test can tell its list from the catalog's own.
type listRegistry struct {
	known  []string
	served []string // what ModelList was last asked for
}

func (r *listRegistry) Known(m string) bool { return slices.Contains(r.known, m) }
func (r *listRegistry) ModelList(served []schemas.Model) []schemas.Model {
	r.served = nil
	out := []schemas.Model{}
	for _, m := range served {
		r.served = append(r.served, m.ID)
		out = append(out, schemas.Model{ID: m.ID, OwnedBy: "registry"})
	}
	return out
}

func TestCatalog(t *testing.T) {
	fl := fleet.New()
	now := time.Now()
	fl.Observe(schemas.Heartbeat{Worker: "w1", Models: []string{"b", "a"}, MaxConcurrency: 4, Healthy: true}, now)
	fl.Observe(schemas.Heartbeat{Worker: "w2", Models: []string{"c"}, MaxConcurrency: 4, Healthy: true, Draining: true, Running: 1}, now)
	reg := &listRegistry{known: []string{"registered-idle"}}
	tests := []struct {
		name  string
		cat   Catalog
		known map[string]bool
		ids   []string
		owner string
	}{
		{"with a registry", NewCatalog(fl, reg),
			map[string]bool{"a": true, "registered-idle": true, "c": false, "nope": false}, []string{"a", "b"}, "registry"},
		{"without a registry", NewCatalog(fl, nil),
			map[string]bool{"a": true, "registered-idle": false, "c": false, "nope": false}, []string{"a", "b"}, "tokenbus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for m, want := range tt.known {
				if got := tt.cat.Known(m); got != want {
					t.Errorf("Known(%s) = %v, want %v", m, got, want)
				}
			}
			var ids []string
			for _, m := range tt.cat.Models() {
				ids = append(ids, m.ID)
				if m.OwnedBy != tt.owner || m.Object != "model" && tt.owner == "tokenbus" {
					t.Errorf("model %+v, want owned by %s", m, tt.owner)
				}
			}
			if !slices.Equal(ids, tt.ids) {
				t.Errorf("models %v, want %v (served by a live, non-draining worker, sorted)", ids, tt.ids)
			}
			if n := tt.cat.WorkersUp(); n != 2 {
				t.Errorf("WorkersUp %d, want 2 (a draining worker is up)", n)
			}
			if n := tt.cat.WorkersServing(); n != 1 {
				t.Errorf("WorkersServing %d, want 1 (a draining worker does not serve)", n)
			}
		})
	}
	if slices.Sort(reg.served); !slices.Equal(reg.served, []string{"a", "b"}) {
		t.Fatalf("the registry was asked to list %v", reg.served)
	}
}

// /ready counts a worker only when it can take a request: healthy (its
// engine), not draining, serving a model.
func TestCatalogWorkersServing(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		hb   schemas.Heartbeat
		want int
	}{
		{"healthy", schemas.Heartbeat{Models: []string{"m"}, Healthy: true}, 1},
		{"engine unhealthy", schemas.Heartbeat{Models: []string{"m"}}, 0},
		{"draining", schemas.Heartbeat{Models: []string{"m"}, Healthy: true, Draining: true}, 0},
		{"no model", schemas.Heartbeat{Healthy: true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := fleet.New()
			tc.hb.Worker, tc.hb.MaxConcurrency = "w", 4
			fl.Observe(tc.hb, now)
			cat := NewCatalog(fl, nil)
			if cat.WorkersUp() != 1 {
				t.Fatalf("WorkersUp %d", cat.WorkersUp())
			}
			if n := cat.WorkersServing(); n != tc.want {
				t.Errorf("WorkersServing %d, want %d", n, tc.want)
			}
		})
	}
}

// /v1/models as vLLM lists it: base models first, then each base's
// adapters; max_model_len from the workers (the smallest where they differ),
// an adapter's its base's; parent from the heartbeat when the registry does
// not know the adapter.
func TestCatalogOrder(t *testing.T) {
	fl := fleet.New()
	now := time.Now()
	for _, hb := range []schemas.Heartbeat{
		{Worker: "w1", Models: []string{"zeta", "zeta-lora", "alpha-lora"}, Adapters: []string{"zeta-lora", "alpha-lora"},
			MaxModelLen: map[string]int{"zeta": 4096}},
		{Worker: "w2", Models: []string{"alpha", "alpha-b"}, Adapters: []string{"alpha-b"}, MaxModelLen: map[string]int{"alpha": 32768}},
		{Worker: "w3", Models: []string{"alpha"}, MaxModelLen: map[string]int{"alpha": 16384}},
		{Worker: "w4", Models: []string{"unhealthy"}, MaxModelLen: map[string]int{"alpha": 1}, Healthy: false},
	} {
		hb.MaxConcurrency, hb.Healthy = 4, hb.Worker != "w4"
		fl.Observe(hb, now)
	}
	reg := &parentRegistry{adapters: map[string]string{"alpha-lora": "alpha", "alpha-a": "alpha", "orphan": "gone"}}
	type entry struct {
		id, parent string
		maxLen     int
	}
	var got []entry
	for _, m := range NewCatalog(fl, reg).Models() {
		got = append(got, entry{m.ID, deref(m.Parent), m.MaxModelLen})
	}
	want := []entry{
		{"alpha", "", 16384}, {"zeta", "", 4096},
		{"alpha-a", "alpha", 16384}, {"alpha-b", "alpha", 16384}, {"alpha-lora", "alpha", 16384}, {"zeta-lora", "zeta", 4096},
		{"orphan", "gone", 0},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("models\n%v, want\n%v", got, want)
	}
}

// parentRegistry knows some adapters' bases (one of them not served: it is
// listed all the same, after the others, as a registry may hold it).
type parentRegistry struct{ adapters map[string]string }

func (r *parentRegistry) Known(m string) bool { _, ok := r.adapters[m]; return ok }
func (r *parentRegistry) ModelList(served []schemas.Model) []schemas.Model {
	for i, m := range served {
		if base, ok := r.adapters[m.ID]; ok {
			served[i].Parent = &base
		}
	}
	for _, name := range []string{"alpha-a", "orphan"} {
		base := r.adapters[name]
		served = append(served, schemas.Model{ID: name, Parent: &base})
	}
	return served
}
