package dispatcher

import (
	"slices"
	"sync"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Table is the live worker table, built from heartbeats. A worker whose
// heartbeats stop for MissedBeats intervals is gone. It is safe for
// concurrent use; gateways hold one too (for /ready and /v1/models).
type Table struct {
	MissedBeats int // default 3

	mu      sync.RWMutex
	workers map[string]*workerState
	rr      uint64 // rotates ties between equally loaded workers
}

type workerState struct {
	hb       schemas.Heartbeat
	models   map[string]struct{}
	lastSeen time.Time
	load     int // requests in flight: the worker's last report plus what we sent since
}

// NewTable makes an empty table.
func NewTable() *Table { return &Table{MissedBeats: 3, workers: map[string]*workerState{}} }

// Observe records a heartbeat; it reports whether the worker is new.
func (t *Table) Observe(hb schemas.Heartbeat, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.workers[hb.Worker]
	if !ok {
		w = &workerState{}
		t.workers[hb.Worker] = w
	}
	if ok && hb.Seq != 0 && hb.Seq < w.hb.Seq && w.hb.Seq-hb.Seq < 1<<20 {
		return false // reordered: an older beat
	}
	if !ok || !slices.Equal(w.hb.Models, hb.Models) {
		w.models = make(map[string]struct{}, len(hb.Models))
		for _, m := range hb.Models {
			w.models[m] = struct{}{}
		}
	}
	w.hb = hb
	w.lastSeen = now
	w.load = hb.Running
	return !ok
}

// Finished records a done notice: the worker's running count after it.
func (t *Table) Finished(worker string, running int) {
	t.mu.Lock()
	if w := t.workers[worker]; w != nil {
		w.load = running
	}
	t.mu.Unlock()
}

// MarkFull records that a worker bounced a request: treat it as full until it
// reports again.
func (t *Table) MarkFull(worker string) {
	t.mu.Lock()
	if w := t.workers[worker]; w != nil {
		w.load = max(w.load, w.hb.MaxConcurrency)
	}
	t.mu.Unlock()
}

// Expire removes workers not heard from in MissedBeats intervals and returns their ids.
func (t *Table) Expire(now time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var gone []string
	for id, w := range t.workers {
		iv := time.Duration(w.hb.IntervalMS) * time.Millisecond
		if iv <= 0 {
			iv = time.Second
		}
		if now.Sub(w.lastSeen) > time.Duration(t.MissedBeats)*iv {
			delete(t.workers, id)
			gone = append(gone, id)
		}
	}
	return gone
}

// Remove forgets a worker at once (its last heartbeat said it is draining and idle).
func (t *Table) Remove(worker string) {
	t.mu.Lock()
	delete(t.workers, worker)
	t.mu.Unlock()
}

// Acquire picks the least-loaded live worker serving model with a free slot,
// not excluded, and counts one more request on it. ok is false when none has
// room; serving says how many live workers serve the model at all.
func (t *Table) Acquire(model, exclude string) (id string, serving int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var best *workerState
	bestRatio := 2.0
	t.rr++
	for wid, w := range t.workers {
		if _, yes := w.models[model]; !yes || w.hb.Draining || !w.hb.Healthy {
			continue
		}
		serving++
		if wid == exclude || w.load >= w.hb.MaxConcurrency {
			continue
		}
		ratio := float64(w.load) / float64(max(w.hb.MaxConcurrency, 1))
		// Ties go to a rotating choice so equal workers share the load.
		if ratio < bestRatio || ratio == bestRatio && (t.rr+uint64(len(wid)))%2 == 0 {
			best, bestRatio, id = w, ratio, wid
		}
	}
	if best == nil {
		return "", serving, false
	}
	best.load++
	return id, serving, true
}

// Serving reports how many live, non-draining workers serve model.
func (t *Table) Serving(model string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, w := range t.workers {
		if _, yes := w.models[model]; yes && !w.hb.Draining && w.hb.Healthy {
			n++
		}
	}
	return n
}

// Len is the number of live workers.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.workers)
}

// ModelsOf returns the models worker serves.
func (t *Table) ModelsOf(worker string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if w := t.workers[worker]; w != nil {
		return w.hb.Models
	}
	return nil
}

// Models returns every model served by a live, healthy worker.
func (t *Table) Models() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	seen := map[string]struct{}{}
	var out []string
	for _, w := range t.workers {
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

// Snapshot returns the last heartbeat of every live worker with its load estimate.
func (t *Table) Snapshot() []WorkerInfo {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]WorkerInfo, 0, len(t.workers))
	for _, w := range t.workers {
		out = append(out, WorkerInfo{Heartbeat: w.hb, Load: w.load, LastSeen: w.lastSeen})
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int {
		if a.Worker < b.Worker {
			return -1
		}
		return 1
	})
	return out
}

// WorkerInfo is one row of Snapshot.
type WorkerInfo struct {
	schemas.Heartbeat
	Load     int       `json:"load"`
	LastSeen time.Time `json:"last_seen"`
}
