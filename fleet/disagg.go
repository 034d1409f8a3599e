package fleet

import "github.com/tokenbus/tokenbus/schemas"

// Prefill/decode disaggregation (docs/disaggregation.md): workers of role
// prefill run only the prefills a dispatcher hands out with a request it
// disaggregates; every Acquire, Serving and capacity count passes over
// them, so a model served by prefill workers alone has no worker.

// prefillOnly reports whether w is a prefill worker.
func (w *workerState) prefillOnly() bool { return w.hb.Role == schemas.RolePrefill }

// AcquirePrefill picks a prefill worker for a prompt of model, given as
// chained block hashes (nil: by load alone), as AcquirePrefix picks among
// the others: the best prefix score (the share of the prompt it holds by
// our record, less its load, waiting queue and KV use), awake ones first,
// none excluded or full; it counts one more request on it (its done notice
// takes it off) and records the prompt's blocks there. ok is false when no
// prefill worker of model has room; live counts the prefill workers of
// model at all.
func (f *Fleet) AcquirePrefill(model, exclude string, hashes []uint64) (id string, live, cached int, ok bool) {
	return f.acquire(model, exclude, hashes, true)
}

// PrefillWorkers counts the live, healthy, non-draining prefill workers of
// model. Until a prefill worker has ever been seen it returns 0 at once:
// a dispatcher asks on every long prompt, and most fleets have none.
func (f *Fleet) PrefillWorkers(model string) int {
	if !f.prefillSeen.Load() {
		return 0
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if _, yes := w.models[model]; yes && w.prefillOnly() && !w.hb.Draining && w.hb.Healthy {
			n++
		}
	}
	return n
}

// Release takes back one request counted on worker by an Acquire whose
// request never reached it (a disaggregated request bounced by its decode
// worker before it sent the prefill).
func (f *Fleet) Release(worker string) {
	f.mu.Lock()
	if w := f.workers[worker]; w != nil && w.load > 0 {
		w.load--
	}
	f.mu.Unlock()
}
