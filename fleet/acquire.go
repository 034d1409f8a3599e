package fleet

import (
	"slices"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Acquire picks the least-loaded live worker serving model with a free slot,
// not excluded (exclude: a comma-separated list, schemas.ExcludeHas), and counts one more request on it. ok is false when none has
// room; serving says how many live workers serve the model at all.
func (f *Fleet) Acquire(model, exclude string) (id string, serving int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var best *workerState
	bestRatio := 2.0
	f.rr++
	for wid, w := range f.workers {
		if _, yes := w.models[model]; !yes || w.hb.Draining || !w.hb.Healthy {
			continue
		}
		serving++
		if schemas.ExcludeHas(exclude, wid) || w.load >= w.hb.MaxConcurrency {
			continue
		}
		ratio := float64(w.load) / float64(max(w.hb.MaxConcurrency, 1))
		// Ties go to a rotating choice so equal workers share the load.
		if ratio < bestRatio || ratio == bestRatio && (f.rr+uint64(len(wid)))%2 == 0 {
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
//     loaded or loading, or to which this fleet sent a load of it that no
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
func (f *Fleet) AcquireAdapter(adapter, base, exclude string, now time.Time) (id string, serving int, how Placement, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	type pick struct {
		w     *workerState
		id    string
		ratio float64
	}
	f.rr++
	better := func(p *pick, w *workerState, wid string, ratio float64) {
		if p.w == nil || ratio < p.ratio || ratio == p.ratio && (f.rr+uint64(len(wid)))%2 == 0 {
			*p = pick{w, wid, ratio}
		}
	}
	var holder, free, evict pick
	pend := f.pending[adapter]
	for wid, w := range f.workers {
		_, hasBase := w.models[base]
		_, hasSelf := w.models[adapter]
		if !hasBase && !hasSelf || w.hb.Draining || !w.hb.Healthy {
			continue
		}
		serving++
		if schemas.ExcludeHas(exclude, wid) || w.load >= w.hb.MaxConcurrency {
			continue
		}
		ratio := float64(w.load) / float64(max(w.hb.MaxConcurrency, 1))
		_, listed := w.adapters[adapter]
		_, pending := pend[wid]
		switch {
		case hasSelf || listed || pending:
			better(&holder, w, wid, ratio)
		case f.freeSlotLocked(wid, w):
			better(&free, w, wid, ratio)
		default:
			better(&evict, w, wid, ratio)
		}
	}
	var p pick
	switch {
	case holder.w != nil && (free.w == nil || holder.ratio-free.ratio < f.AdapterSpill):
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
			f.pending[adapter] = pend
		}
		pend[p.id] = now
	}
	return p.id, serving, how, true
}

// freeSlotLocked reports whether worker has a LoRA slot that neither a
// loaded adapter, one being loaded, nor a load pending from us takes.
func (f *Fleet) freeSlotLocked(id string, w *workerState) bool {
	if w.hb.MaxLoras <= 0 {
		return true
	}
	used := len(w.adapters)
	for adapter, on := range f.pending {
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
func (f *Fleet) ServingAdapter(adapter, base string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		_, hasBase := w.models[base]
		_, hasSelf := w.models[adapter]
		if (hasBase || hasSelf) && !w.hb.Draining && w.hb.Healthy {
			n++
		}
	}
	return n
}

// Pending lists the workers this fleet sent a load of adapter to that no
// heartbeat has settled yet, sorted.
func (f *Fleet) Pending(adapter string) []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []string
	for id := range f.pending[adapter] {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
