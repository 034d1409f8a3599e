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
func (r *listRegistry) ModelList(served []string) []schemas.Model {
	r.served = served
	out := []schemas.Model{}
	for _, m := range served {
		out = append(out, schemas.Model{ID: m, OwnedBy: "registry"})
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
	if !slices.Equal(reg.served, []string{"a", "b"}) {
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
