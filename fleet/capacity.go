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
