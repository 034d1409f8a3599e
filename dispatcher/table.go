package dispatcher

import (
	"encoding/json"
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
	// AdapterSpill is how much busier (in load ratio, running over max
	// concurrency) the least-loaded worker holding an adapter may be than the
	// least-loaded worker with a free LoRA slot before a request for the
	// adapter goes to the latter, which loads a second copy. Default 0.5.
	AdapterSpill float64

	mu      sync.RWMutex
	workers map[string]*workerState
	rr      uint64 // rotates ties between equally loaded workers
	// pending records the adapter loads this table's owner caused and no
	// heartbeat has confirmed yet: adapter → worker → when it was sent.
	pending map[string]map[string]time.Time
}

type workerState struct {
	hb       schemas.Heartbeat
	models   map[string]struct{}
	adapters map[string]struct{} // hb.Adapters and hb.Loading: what the worker has or is getting
	lastSeen time.Time
	load     int // requests in flight: the worker's last report plus what we sent since
}

// NewTable makes an empty table.
func NewTable() *Table {
	return &Table{MissedBeats: 3, AdapterSpill: 0.5, workers: map[string]*workerState{},
		pending: map[string]map[string]time.Time{}}
}

// Heartbeat applies a heartbeat message: a draining worker with nothing
// running leaves the table, any other is observed. ok is false for a message
// that is not a heartbeat; joined reports a worker new to the table.
func (t *Table) Heartbeat(data []byte, now time.Time) (hb schemas.Heartbeat, joined, ok bool) {
	if json.Unmarshal(data, &hb) != nil || !schemas.ValidToken(hb.Worker) {
		return hb, false, false
	}
	if hb.Draining && hb.Running == 0 {
		t.Remove(hb.Worker)
		return hb, false, true
	}
	return hb, t.Observe(hb, now), true
}

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
	if !ok || !slices.Equal(w.hb.Adapters, hb.Adapters) || !slices.Equal(w.hb.Loading, hb.Loading) {
		w.adapters = make(map[string]struct{}, len(hb.Adapters)+len(hb.Loading))
		for _, a := range hb.Adapters {
			w.adapters[a] = struct{}{}
		}
		for _, a := range hb.Loading {
			w.adapters[a] = struct{}{}
		}
	}
	w.hb = hb
	w.lastSeen = now
	w.load = hb.Running
	t.settlePendingLocked(hb.Worker, w, now)
	return !ok
}

// settlePendingLocked drops the pending loads on worker that its heartbeat
// settles: the adapter is listed (loaded or loading: the heartbeat speaks
// for it from now on), or it is not and the load was sent at least one
// heartbeat interval ago (the load failed, or the adapter was evicted again).
func (t *Table) settlePendingLocked(worker string, w *workerState, now time.Time) {
	for adapter, on := range t.pending {
		since, ok := on[worker]
		if !ok {
			continue
		}
		_, listed := w.adapters[adapter]
		if listed || now.Sub(since) >= w.interval() {
			delete(on, worker)
			if len(on) == 0 {
				delete(t.pending, adapter)
			}
		}
	}
}

func (w *workerState) interval() time.Duration {
	if iv := time.Duration(w.hb.IntervalMS) * time.Millisecond; iv > 0 {
		return iv
	}
	return time.Second
}

func (t *Table) forgetPendingLocked(worker string) {
	for adapter, on := range t.pending {
		delete(on, worker)
		if len(on) == 0 {
			delete(t.pending, adapter)
		}
	}
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
		if now.Sub(w.lastSeen) > time.Duration(t.MissedBeats)*w.interval() {
			delete(t.workers, id)
			t.forgetPendingLocked(id)
			gone = append(gone, id)
		}
	}
	return gone
}

// Remove forgets a worker at once (its last heartbeat said it is draining and idle).
func (t *Table) Remove(worker string) {
	t.mu.Lock()
	delete(t.workers, worker)
	t.forgetPendingLocked(worker)
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

// Placement says how AcquireAdapter placed a request for an adapter.
type Placement int

const (
	// PlacedHolder: the worker has the adapter loaded, is loading it, or was
	// sent a load of it that no heartbeat has confirmed yet.
	PlacedHolder Placement = iota
	// PlacedFreeSlot: the worker loads the adapter into a free LoRA slot.
	PlacedFreeSlot
	// PlacedEvict: every candidate's slots are full; the worker evicts an
	// adapter to load this one.
	PlacedEvict
)

func (p Placement) String() string {
	switch p {
	case PlacedHolder:
		return "holder"
	case PlacedFreeSlot:
		return "free_slot"
	case PlacedEvict:
		return "evict"
	}
	return "unknown"
}

// AcquireAdapter picks a worker for a request for LoRA adapter of base model
// base, not excluded, and counts one more request on it. The candidates are
// the live, healthy, non-draining workers that serve base (or the adapter
// itself); serving counts them. Among those with room (load under max
// concurrency):
//
//  1. the least-loaded holder: a worker whose heartbeat lists the adapter as
//     loaded or loading, or to which this table sent a load of it that no
//     heartbeat has settled yet (so concurrent first requests all go to one
//     worker and cause one load);
//  2. unless the least-loaded worker with a free LoRA slot (adapters loaded,
//     loading and pending below MaxLoras; MaxLoras 0 counts as free) has a
//     load ratio at least AdapterSpill lower: then that worker, which loads a
//     second copy;
//  3. with no holder with room: the least-loaded worker with a free slot;
//  4. else the least-loaded worker, which evicts an adapter to load it.
//
// A holder with room is never passed over for a worker that must evict. When
// the choice is not a holder, the load is recorded as pending on it. ok is
// false when no candidate has room.
func (t *Table) AcquireAdapter(adapter, base, exclude string, now time.Time) (id string, serving int, how Placement, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	type pick struct {
		w     *workerState
		id    string
		ratio float64
	}
	t.rr++
	better := func(p *pick, w *workerState, wid string, ratio float64) {
		if p.w == nil || ratio < p.ratio || ratio == p.ratio && (t.rr+uint64(len(wid)))%2 == 0 {
			*p = pick{w, wid, ratio}
		}
	}
	var holder, free, evict pick
	pend := t.pending[adapter]
	for wid, w := range t.workers {
		_, hasBase := w.models[base]
		_, hasSelf := w.models[adapter]
		if !hasBase && !hasSelf || w.hb.Draining || !w.hb.Healthy {
			continue
		}
		serving++
		if wid == exclude || w.load >= w.hb.MaxConcurrency {
			continue
		}
		ratio := float64(w.load) / float64(max(w.hb.MaxConcurrency, 1))
		_, listed := w.adapters[adapter]
		_, pending := pend[wid]
		switch {
		case hasSelf || listed || pending:
			better(&holder, w, wid, ratio)
		case t.freeSlotLocked(wid, w):
			better(&free, w, wid, ratio)
		default:
			better(&evict, w, wid, ratio)
		}
	}
	var p pick
	switch {
	case holder.w != nil && (free.w == nil || holder.ratio-free.ratio < t.AdapterSpill):
		p, how = holder, PlacedHolder
	case free.w != nil:
		p, how = free, PlacedFreeSlot
	case evict.w != nil:
		p, how = evict, PlacedEvict
	default:
		return "", serving, 0, false
	}
	p.w.load++
	if how != PlacedHolder {
		if pend == nil {
			pend = map[string]time.Time{}
			t.pending[adapter] = pend
		}
		pend[p.id] = now
	}
	return p.id, serving, how, true
}

// freeSlotLocked reports whether worker has a LoRA slot that neither a
// loaded adapter, one being loaded, nor a load pending from us takes.
func (t *Table) freeSlotLocked(id string, w *workerState) bool {
	if w.hb.MaxLoras <= 0 {
		return true
	}
	used := len(w.adapters)
	for adapter, on := range t.pending {
		if _, ok := on[id]; ok {
			if _, listed := w.adapters[adapter]; !listed {
				used++
			}
		}
	}
	return used < w.hb.MaxLoras
}

// ServingAdapter reports how many live, non-draining workers could serve
// adapter: those serving its base model or the adapter itself.
func (t *Table) ServingAdapter(adapter, base string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, w := range t.workers {
		_, hasBase := w.models[base]
		_, hasSelf := w.models[adapter]
		if (hasBase || hasSelf) && !w.hb.Draining && w.hb.Healthy {
			n++
		}
	}
	return n
}

// Pending lists the workers this table sent a load of adapter to that no
// heartbeat has settled yet, sorted.
func (t *Table) Pending(adapter string) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []string
	for id := range t.pending[adapter] {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
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
