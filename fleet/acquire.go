package fleet

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Acquire picks the least-loaded live worker serving model with a free slot,
// not excluded (exclude: a comma-separated list, schemas.ExcludeHas), and counts one more request on it. ok is false when none has
// room; serving says how many live workers serve the model at all. A
// sleeping worker (schemas.Heartbeat.Sleeping) is chosen only when no awake
// one has room: it is capacity a wake-up away (docs/capacity.md).
func (f *Fleet) Acquire(model, exclude string) (id string, serving int, ok bool) {
	id, serving, _, ok = f.AcquirePrefix(model, exclude, nil)
	return id, serving, ok
}

// AcquirePrefix is Acquire for a prompt given as chained block hashes
// (hashed with the model as root; see docs/routing.md): with hashes, the
// candidate with the best score (Fleet.CacheWeight: the share of the prompt
// it holds by our record, less its load and KV use) wins instead of the
// least loaded, and the prompt's blocks are recorded on the worker chosen,
// in the same step. cached is how many of hashes that worker holds by our
// record. Without hashes it is Acquire exactly. Awake workers come first
// either way; a sleeping one's cache is empty anyway (a sleep frees it).
func (f *Fleet) AcquirePrefix(model, exclude string, hashes []uint64) (id string, serving, cached int, ok bool) {
	return f.acquire(model, exclude, hashes, false)
}

// acquire picks, counts and records as AcquirePrefix says among the
// workers of model of one kind: prefill workers (prefill) or the others.
// candidates counts the live, healthy, non-draining workers of that kind.
func (f *Fleet) acquire(model, exclude string, hashes []uint64, prefill bool) (id string, candidates, cached int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var best *workerState
	bestScore := -1e300
	f.rr++
	for wid, w := range f.workers {
		if _, yes := w.models[model]; !yes || w.hb.Draining || !w.hb.Healthy || w.prefillOnly() != prefill {
			continue
		}
		candidates++
		if schemas.ExcludeHas(exclude, wid) || w.load >= w.hb.MaxConcurrency || w.switching() {
			continue
		}
		ratio := float64(w.load) / float64(max(w.hb.MaxConcurrency, 1))
		score, c := -ratio, 0
		if len(hashes) > 0 {
			score, c = f.scoreLocked(w, ratio, hashes)
		}
		// An awake worker beats a sleeping one, whatever their scores; then
		// the score. Ties go to a rotating choice so equal workers share
		// the load.
		order := -1
		if best != nil {
			order = awakeFirst(w, best)
		}
		if order < 0 || order == 0 && (score > bestScore || score == bestScore && (f.rr+uint64(len(wid)))%2 == 0) {
			best, bestScore, id, cached = w, score, wid, c
		}
	}
	if best == nil {
		return "", candidates, 0, false
	}
	best.load++
	f.recordLocked(best, hashes)
	return id, candidates, cached, true
}

// awakeFirst orders two candidates by sleep alone: -1 when only a is
// awake, 1 when only b is, else 0.
func awakeFirst(a, b *workerState) int {
	switch {
	case a.hb.Sleeping == b.hb.Sleeping:
		return 0
	case b.hb.Sleeping:
		return -1
	}
	return 1
}

// scoreLocked is a candidate's prefix score (see Fleet.CacheWeight) and how
// many of the prompt's leading blocks our record says it holds.
func (f *Fleet) scoreLocked(w *workerState, ratio float64, hashes []uint64) (float64, int) {
	cached := w.prefix.matched(hashes)
	wait := float64(w.hb.Waiting) / float64(max(w.hb.MaxConcurrency, 1))
	return f.CacheWeight*float64(cached)/float64(len(hashes)) - ratio - wait - f.KVWeight*w.hb.KVCacheUsage, cached
}

// recordLocked notes that a prompt's blocks were just sent to w.
func (f *Fleet) recordLocked(w *workerState, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	if w.prefix == nil {
		w.prefix = newPrefixLRU(f.prefixCap(w))
	}
	w.prefix.record(hashes)
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
//  4. else the worker whose coldest evictable adapter (by AdapterRate: the
//     one it would evict; not one it seems to be using, see AdapterBusyFor,
//     unless all seem in use everywhere) is coldest, the least loaded of
//     equals (without AdapterRate: the least loaded), which evicts an
//     adapter to load it.
//
// A holder with room is never passed over for a worker that must evict. When
// the choice is not a holder, the load is recorded as pending on it. ok is
// false when no candidate has room. Sleeping workers are candidates only
// when no awake one has room (then chosen by the same rules among them).
func (f *Fleet) AcquireAdapter(adapter, base, exclude string, now time.Time) (id string, serving int, how Placement, ok bool) {
	id, serving, how, _, ok = f.AcquireAdapterPrefix(adapter, base, exclude, nil, now)
	return id, serving, how, ok
}

// AcquireAdapterPrefix is AcquireAdapter for a prompt with chained block
// hashes (hashed with the adapter's own root, so that its prefix cache is
// apart from its base model's): within each class (holders, free slots,
// evictions) the worker with the best prefix score wins instead of the least
// loaded, and the prompt's blocks are recorded on the worker chosen. cached
// is how many of hashes that worker holds by our record.
func (f *Fleet) AcquireAdapterPrefix(adapter, base, exclude string, hashes []uint64, now time.Time) (id string, serving int, how Placement, cached int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	type pick struct {
		w      *workerState
		id     string
		ratio  float64
		score  float64
		cached int
	}
	f.rr++
	better := func(p *pick, w *workerState, wid string, ratio float64) {
		score, cached := -ratio, 0
		if len(hashes) > 0 {
			score, cached = f.scoreLocked(w, ratio, hashes)
		}
		if p.w == nil || score > p.score || score == p.score && (f.rr+uint64(len(wid)))%2 == 0 {
			*p = pick{w, wid, ratio, score, cached}
		}
	}
	var holder, free, evict pick
	pend := f.pending[adapter]
	asleep := false // the pass: awake workers first, sleeping ones if none has room
	for pass := range 2 {
		asleep = pass == 1
		for wid, w := range f.workers {
			_, hasBase := w.models[base]
			_, hasSelf := w.models[adapter]
			if !hasBase && !hasSelf || w.hb.Draining || !w.hb.Healthy || w.prefillOnly() {
				continue
			}
			if !asleep {
				serving++
			}
			if w.hb.Sleeping != asleep || schemas.ExcludeHas(exclude, wid) || w.load >= w.hb.MaxConcurrency || w.switching() {
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
		if holder.w != nil || free.w != nil || evict.w != nil {
			break
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
		if f.AdapterRate != nil {
			// A second pass, only when a load must evict (the request waits
			// for a load anyway): among the same candidates, the coldest
			// victim first, then the best score.
			p = pick{}
			coldest := [2]float64{math.Inf(1), math.Inf(1)}
			for wid, w := range f.workers {
				if w.hb.Sleeping != asleep || !evictCandidate(w, wid, adapter, base, exclude, pend) {
					continue
				}
				v := f.victimRatesLocked(wid, w, now)
				if c := cmpRates(v, coldest); c > 0 {
					continue
				} else if c < 0 {
					p, coldest = pick{}, v
				}
				better(&p, w, wid, float64(w.load)/float64(max(w.hb.MaxConcurrency, 1)))
			}
		}
	default:
		return "", serving, 0, 0, false
	}
	p.w.load++
	f.recordLocked(p.w, hashes)
	if p.w.routedAt == nil {
		p.w.routedAt = map[string]time.Time{}
	}
	p.w.routedAt[adapter] = now
	if how != PlacedHolder {
		if pend == nil {
			pend = map[string]time.Time{}
			f.pending[adapter] = pend
		}
		pend[p.id] = now
	}
	return p.id, serving, how, p.cached, true
}

// evictCandidate reports whether worker w (id wid) is one AcquireAdapter
// would send a request for adapter to with an eviction: eligible, with
// room, not a holder (its slots full: the caller found no free slot).
func evictCandidate(w *workerState, wid, adapter, base, exclude string, pend map[string]time.Time) bool {
	_, hasBase := w.models[base]
	_, hasSelf := w.models[adapter]
	_, listed := w.adapters[adapter]
	_, pending := pend[wid]
	return hasBase && !hasSelf && !listed && !pending && !w.hb.Draining && w.hb.Healthy && !w.prefillOnly() &&
		!schemas.ExcludeHas(exclude, wid) && w.load < w.hb.MaxConcurrency && !w.switching()
}

// victimRatesLocked is the AdapterRate of the adapter worker id would
// evict for one more load: of its loaded adapters (not loading ones), the
// coldest, or the (k+1)-th coldest when its slots are k over-committed
// (loads started or sent there whose evictions its heartbeat does not show
// yet: those take the k coldest); +Inf when there is none. [0] leaves out
// the adapters in use there (adapterBusyLocked: the worker evicts none in
// use); [1] counts them, to order workers whose adapters all seem in use.
func (f *Fleet) victimRatesLocked(id string, w *workerState, now time.Time) [2]float64 {
	var idleBuf, allBuf [16]float64
	idle, all := idleBuf[:0], allBuf[:0]
	for _, a := range w.hb.Adapters {
		if slices.Contains(w.hb.Loading, a) {
			continue
		}
		r := f.AdapterRate(a, now)
		all = append(all, r)
		if !f.adapterBusyLocked(w, a, now) {
			idle = append(idle, r)
		}
	}
	over := 0
	if w.hb.MaxLoras > 0 {
		over = max(f.slotsUsedLocked(id, w)-w.hb.MaxLoras, 0)
	}
	var out [2]float64
	for i, rates := range [2][]float64{idle, all} {
		out[i] = math.Inf(1)
		if over < len(rates) {
			slices.Sort(rates)
			out[i] = rates[over]
		}
	}
	return out
}

// cmpRates orders victim rates: the coldest idle victim first, then the
// coldest victim counting those that seem in use.
func cmpRates(a, b [2]float64) int {
	if c := cmp.Compare(a[0], b[0]); c != 0 {
		return c
	}
	return cmp.Compare(a[1], b[1])
}

// freeSlotLocked reports whether worker has a LoRA slot that neither a
// loaded adapter, one being loaded, nor a load pending from us takes.
func (f *Fleet) freeSlotLocked(id string, w *workerState) bool {
	return w.hb.MaxLoras <= 0 || f.slotsUsedLocked(id, w) < w.hb.MaxLoras
}

// slotsUsedLocked counts worker id's adapters loaded and loading, and the
// loads we sent there that its heartbeat does not list yet.
func (f *Fleet) slotsUsedLocked(id string, w *workerState) int {
	used := len(w.adapters)
	for adapter, on := range f.pending {
		if _, ok := on[id]; ok {
			if _, listed := w.adapters[adapter]; !listed {
				used++
			}
		}
	}
	return used
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
		if (hasBase || hasSelf) && !w.hb.Draining && w.hb.Healthy && !w.prefillOnly() {
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

// adapterBusyLocked reports whether adapter a seems in use on worker w: its
// last heartbeat lists it (InUse: a generation longer than any guess), or
// we routed a request for it there within AdapterBusyFor (the heartbeat may
// not show it yet). The second also holds an adapter whose short request
// has just ended for a moment longer; taking the heartbeat's word for that
// at once made a burst of one-off adapters evict hot ones (their recent
// requests all over, the one-off just routed still counted in use).
func (f *Fleet) adapterBusyLocked(w *workerState, a string, now time.Time) bool {
	if at, ok := w.routedAt[a]; ok && now.Sub(at) < f.AdapterBusyFor {
		return true
	}
	return slices.Contains(w.hb.InUse, a)
}
