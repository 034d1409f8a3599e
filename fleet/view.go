package fleet

import (
	"slices"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// View is the read-only side of a Fleet: what gateways (/ready, /v1/models,
// 404 or 503) and the admin API need. *Fleet implements it.
type View interface {
	// Workers lists every live worker, sorted by id.
	Workers() []Worker
	// Serving counts the live, healthy, non-draining workers serving model.
	Serving(model string) int
	// Switchable counts the live workers that can switch to model
	// (Heartbeat CanServe) without serving it now.
	Switchable(model string) int
	// Models lists every model a live, healthy, non-draining worker serves, sorted.
	Models() []string
	// Len counts the live workers.
	Len() int
}

var _ View = (*Fleet)(nil)

// Worker is one live worker: its last heartbeat, the load estimate (its last
// report plus what was sent to it since) and when it was last heard from.
type Worker struct {
	schemas.Heartbeat
	Load     int       `json:"load"`
	LastSeen time.Time `json:"last_seen"`
}

// Workers returns the last heartbeat of every live worker with its load
// estimate, sorted by id.
func (f *Fleet) Workers() []Worker {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]Worker, 0, len(f.workers))
	for _, w := range f.workers {
		out = append(out, Worker{Heartbeat: w.hb, Load: w.load, LastSeen: w.lastSeen})
	}
	slices.SortFunc(out, func(a, b Worker) int { return strings.Compare(a.Worker, b.Worker) })
	return out
}

// Serving reports how many live, non-draining workers serve model (prefill
// workers, which take no request whole, not counted).
func (f *Fleet) Serving(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if _, yes := w.models[model]; yes && !w.hb.Draining && w.hb.Healthy && !w.prefillOnly() {
			n++
		}
	}
	return n
}

// Live reports whether worker id is live (heard from, not gone).
func (f *Fleet) Live(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.workers[id]
	return ok
}

// Len is the number of live workers.
func (f *Fleet) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.workers)
}

// Models returns every model served by a live, healthy worker.
func (f *Fleet) Models() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	seen := map[string]struct{}{}
	var out []string
	for _, w := range f.workers {
		if w.hb.Draining || !w.hb.Healthy {
			continue
		}
		for _, m := range w.hb.Models {
			if _, dup := seen[m]; !dup {
				seen[m] = struct{}{}
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}
