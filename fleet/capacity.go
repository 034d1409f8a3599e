package fleet

// Capacity on demand (docs/capacity.md): workers that can switch to a model
// they have not loaded, and workers asleep.

// Switchable counts the live, healthy, non-draining workers that list model
// in CanServe without serving it now: capacity a model switch away.
func (f *Fleet) Switchable(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if w.hb.Draining || !w.hb.Healthy {
			continue
		}
		if _, serves := w.models[model]; serves {
			continue
		}
		for _, m := range w.hb.CanServe {
			if m == model {
				n++
				break
			}
		}
	}
	return n
}

// Asleep counts the live workers serving model whose engine sleeps:
// capacity a wake-up away.
func (f *Fleet) Asleep(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if _, serves := w.models[model]; serves && w.hb.Sleeping && !w.hb.Draining {
			n++
		}
	}
	return n
}

// switching reports whether w is switching models (Heartbeat.Switching):
// it takes no new request (it would bounce it) until a heartbeat lists the
// new model; it still counts as serving its old models, whose requests
// wait in the queue meanwhile.
func (w *workerState) switching() bool { return w.hb.Switching != "" }

// SwitchingTo counts the live workers switching to model.
func (f *Fleet) SwitchingTo(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if w.hb.Switching == model {
			n++
		}
	}
	return n
}
