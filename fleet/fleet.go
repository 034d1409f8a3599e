package fleet

import (
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Fleet is the live worker table, built from heartbeats and done notices. A
// worker whose heartbeats stop for MissedBeats intervals is gone. It is safe
// for concurrent use. Set MissedBeats and AdapterSpill before first use.
type Fleet struct {
	MissedBeats int // default 3
	// AdapterSpill is how much busier (in load ratio, running over max
	// concurrency) the least-loaded worker holding an adapter may be than the
	// least-loaded worker with a free LoRA slot before a request for the
	// adapter goes to the latter, which loads a second copy. Default 0.5.
	AdapterSpill float64
	// Prefix-aware routing (AcquirePrefix, AcquireAdapter with hashes): see
	// docs/routing.md. A candidate's score is
	//   CacheWeight × (share of the prompt's blocks it holds)
	//   − (load + Waiting) / MaxConcurrency − KVWeight × KVCacheUsage
	// and the highest wins. CacheWeight (default 1) is how much load ratio a
	// fully cached prompt is worth; KVWeight (default 0.25) steers new
	// prompts away from a worker whose KV cache is full of running sequences.
	CacheWeight, KVWeight float64
	// PrefixBlocks bounds the record of one worker's prefix cache, in
	// blocks, when its heartbeat has no kv_cache_tokens (default 8192);
	// with one, the bound is kv_cache_tokens / BlockTokens (BlockTokens:
	// the tokens one hashed block stands for, default 16), at most
	// maxPrefixBlocks.
	PrefixBlocks, BlockTokens int
	// AdapterRate, when set, is the owner's count of the demand for an
	// adapter (requests/s, decayed) at now: a request for an adapter that no
	// worker with room holds, with no free slot anywhere, goes to the worker
	// whose coldest loaded adapter is coldest by it, which is the one the
	// worker evicts (lora.Manager evicts by rate too), rather than to the
	// least loaded, which may hold only hot ones. nil: the least loaded (or
	// best prefix score). It is called with the fleet's lock held: it must
	// not call the Fleet.
	AdapterRate func(adapter string, now time.Time) float64
	// AdapterBusyFor is how long after it routes a request for an adapter
	// to a worker the fleet counts the adapter as in use there, and so as
	// no eviction victim (the worker evicts none a request runs on or waits
	// for), besides those its heartbeat lists (schemas.Heartbeat.InUse),
	// which does not show a request just routed. It should cover a load and
	// a short request's run; default 1s. Without it the newest
	// one-off adapter, the coldest by rate and still serving its request,
	// would draw every next load to its worker, which would then evict a
	// hotter one.
	AdapterBusyFor time.Duration
	mu             sync.RWMutex
	onGone         func(id, why string) // see OnGone
	workers        map[string]*workerState
	rr             uint64 // rotates ties between equally loaded workers
	// pending records the adapter loads this fleet's owner caused and no
	// heartbeat has confirmed yet: adapter → worker → when it was sent.
	pending map[string]map[string]time.Time
	// blindAt is the last time the owner could not hear heartbeats (Blind):
	// for ReconnectGrace after it, no worker expires.
	blindAt time.Time

	switches switchLog // model switches seen in heartbeats (capacity.go)
	// prefillSeen: a prefill worker's heartbeat was ever observed (disagg.go).
	prefillSeen atomic.Bool
}

// ReconnectGrace is how long after its owner's NATS connection is back a
// fleet expires no worker: resubscribing, and heartbeats crossing a
// cluster route to the new server, take a moment, longer on a loaded
// machine, and a worker expired then fails (or moves) every stream it has.
const ReconnectGrace = time.Second

type workerState struct {
	hb       schemas.Heartbeat
	models   map[string]struct{}
	adapters map[string]struct{} // hb.Adapters and hb.Loading: what the worker has or is getting
	lastSeen time.Time
	load     int        // requests in flight: the worker's last report plus what we sent since
	prefix   *prefixLRU // blocks we routed to it lately, or its KV events say it holds; nil until the first
	// routedAt: adapter → when we last routed a request for it here
	// (AdapterBusyFor); entries older than that go at each heartbeat.
	routedAt map[string]time.Time
	kvSeq    uint64 // the Seq of its last KV events message
}

// maxPrefixBlocks caps one worker's prefix record (about 2 MiB).
const maxPrefixBlocks = 1 << 16

// prefixCap is the size of worker w's prefix record.
func (f *Fleet) prefixCap(w *workerState) int {
	if w.hb.KVCacheTokens > 0 {
		return min(max(w.hb.KVCacheTokens/max(f.BlockTokens, 1), 1), maxPrefixBlocks)
	}
	return min(max(f.PrefixBlocks, 1), maxPrefixBlocks)
}

// New makes an empty fleet.
func New() *Fleet {
	return &Fleet{MissedBeats: 3, AdapterSpill: 0.5, CacheWeight: 1, KVWeight: 0.25, PrefixBlocks: 8192, BlockTokens: 16,
		AdapterBusyFor: time.Second,
		workers:        map[string]*workerState{},
		pending:        map[string]map[string]time.Time{}}
}

// Heartbeat applies a heartbeat message: a draining worker with nothing
// running leaves the fleet, any other is observed. ok is false for a message
// that is not a heartbeat; joined reports a worker new to the fleet.
func (f *Fleet) Heartbeat(data []byte, now time.Time) (hb schemas.Heartbeat, joined, ok bool) {
	if json.Unmarshal(data, &hb) != nil || !schemas.ValidToken(hb.Worker) {
		return hb, false, false
	}
	if hb.Draining && hb.Running == 0 {
		// Not a loss: it has nothing running, and the last frames of its
		// streams may still be on their way (another subscription): no OnGone.
		f.remove(hb.Worker, "")
		return hb, false, true
	}
	return hb, f.Observe(hb, now), true
}

// Observe records a heartbeat; it reports whether the worker is new.
func (f *Fleet) Observe(hb schemas.Heartbeat, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[hb.Worker]
	if !ok {
		w = &workerState{}
		f.workers[hb.Worker] = w
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
	if ok {
		f.switches.observeLocked(&w.hb, hb, now)
	}
	w.hb = hb
	if hb.Role == schemas.RolePrefill {
		f.prefillSeen.Store(true)
	}
	if w.prefix != nil {
		w.prefix.resize(f.prefixCap(w))
	}
	w.lastSeen = now
	w.load = hb.Running
	for a, at := range w.routedAt {
		if now.Sub(at) >= f.AdapterBusyFor {
			delete(w.routedAt, a)
		}
	}
	f.settlePendingLocked(hb.Worker, w, now)
	return !ok
}

// settlePendingLocked drops the pending loads on worker that its heartbeat
// settles: the adapter is listed (loaded or loading: the heartbeat speaks
// for it from now on), or it is not and the load was sent at least one
// heartbeat interval ago (the load failed, or the adapter was evicted again).
func (f *Fleet) settlePendingLocked(worker string, w *workerState, now time.Time) {
	for adapter, on := range f.pending {
		since, ok := on[worker]
		if !ok {
			continue
		}
		_, listed := w.adapters[adapter]
		if listed || now.Sub(since) >= w.interval() {
			delete(on, worker)
			if len(on) == 0 {
				delete(f.pending, adapter)
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

func (f *Fleet) forgetPendingLocked(worker string) {
	for adapter, on := range f.pending {
		delete(on, worker)
		if len(on) == 0 {
			delete(f.pending, adapter)
		}
	}
}

// Done applies a done notice message; ok is false for a message that is not
// one.
func (f *Fleet) Done(data []byte) (n schemas.DoneNotice, ok bool) {
	if n, ok = schemas.ParseDoneNotice(data); ok {
		f.Finished(n.Worker, n.Running)
	}
	return n, ok
}

// Finished records a done notice: the worker's running count after it.
// One request left, so our count drops by one, or to the worker's if that
// is higher (requests other dispatchers sent). Not below it: requests we
// sent that are still on their way to the worker are in our count but not
// yet in its; taking its count would send them a second time over, and
// the worker would hand them back (a synchronised batch of done notices
// did so, often).
func (f *Fleet) Finished(worker string, running int) {
	f.mu.Lock()
	if w := f.workers[worker]; w != nil {
		w.load = max(running, w.load-1)
	}
	f.mu.Unlock()
}

// MarkFull records that a worker bounced a request: treat it as full until it
// reports again.
func (f *Fleet) MarkFull(worker string) {
	f.mu.Lock()
	if w := f.workers[worker]; w != nil {
		w.load = max(w.load, w.hb.MaxConcurrency)
	}
	f.mu.Unlock()
}

// Expire removes workers not heard from in MissedBeats intervals and returns their ids.
func (f *Fleet) Expire(now time.Time) []string {
	f.mu.Lock()
	if !f.blindAt.IsZero() && now.Sub(f.blindAt) < ReconnectGrace {
		f.mu.Unlock()
		return nil
	}
	var gone []string
	for id, w := range f.workers {
		if now.Sub(w.lastSeen) > time.Duration(f.MissedBeats)*w.interval() {
			delete(f.workers, id)
			f.forgetPendingLocked(id)
			gone = append(gone, id)
		}
	}
	onGone := f.onGone
	f.mu.Unlock()
	if onGone != nil {
		for _, id := range gone {
			onGone(id, WhyNoHeartbeat)
		}
	}
	return gone
}

// OnGone sets fn to be called, outside the fleet's lock, with the id of every
// worker lost: expired (why: WhyNoHeartbeat) or removed with Remove's reason.
// A worker whose last heartbeat said draining and idle is not lost: its
// streams have ended, though their last frames may still be in flight. A gateway ends that
// worker's streams with it (client.WorkerLost) rather than let them wait out
// their stall timeout. It may be set while the fleet is in use.
func (f *Fleet) OnGone(fn func(id, why string)) {
	f.mu.Lock()
	f.onGone = fn
	f.mu.Unlock()
}

// Blind tells the fleet that its owner cannot hear heartbeats now (its NATS
// connection is down): silence is not the workers' fault, so none expires
// for it. Call it on every sweep while disconnected; after the reconnect the
// workers have MissedBeats intervals to be heard again.
func (f *Fleet) Blind(now time.Time) {
	f.mu.Lock()
	f.blindAt = now
	for _, w := range f.workers {
		if now.After(w.lastSeen) {
			w.lastSeen = now
		}
	}
	f.mu.Unlock()
}

// WhyNoHeartbeat is the reason OnGone gives for an expired worker.
const WhyNoHeartbeat = "no heartbeat"

// Remove forgets a worker at once (e.g. NATS saw its connection close); why
// is passed to OnGone.
func (f *Fleet) Remove(worker, why string) { f.remove(worker, why) }

func (f *Fleet) remove(worker, why string) {
	f.mu.Lock()
	_, known := f.workers[worker]
	delete(f.workers, worker)
	f.forgetPendingLocked(worker)
	onGone := f.onGone
	f.mu.Unlock()
	if known && onGone != nil && why != "" {
		onGone(worker, why)
	}
}

// ModelsOf returns the models worker serves.
func (f *Fleet) ModelsOf(worker string) []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if w := f.workers[worker]; w != nil {
		return w.hb.Models
	}
	return nil
}
