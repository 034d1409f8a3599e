package registry

import (
	"slices"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// ModelList completes the /v1/models list: every entry of served (what
// live workers serve now, as their heartbeats tell it) with the registry's
// metadata where it has some, every registered base model (one no live
// worker serves is held for: docs/capacity.md), and every registered
// adapter whose base model is served or registered, since a worker of the
// base loads it on demand. Adapters have
// parent = their base and root = their weights' path, as in vLLM. A base
// model's registered max_model_len wins over what workers report: the
// operator's word, and what rate limits reserve against. Sorted by id (the
// gateway orders the list as vLLM does). c may be nil (no registry).
func (c *Cache) ModelList(served []schemas.Model) []schemas.Model {
	now := time.Now().Unix()
	byName := map[string]Model{}
	if c != nil {
		c.mu.RLock()
		byName = c.models
		c.mu.RUnlock() // the map is replaced on refresh, never written to
	}
	isServed := make(map[string]bool, len(served))
	for _, m := range served {
		isServed[m.ID] = true
	}
	out := make([]schemas.Model, 0, len(served))
	add := func(m schemas.Model) {
		if r, ok := byName[m.ID]; ok {
			m.Created = r.Created
			if r.MaxModelLen > 0 {
				m.MaxModelLen = r.MaxModelLen
			}
			if r.OwnedBy != "" {
				m.OwnedBy = r.OwnedBy
			}
			if r.IsAdapter() {
				base := r.Base
				m.Parent, m.Root = &base, r.Path
			}
		}
		out = append(out, m)
	}
	for _, m := range served {
		add(m)
	}
	for name, r := range byName {
		if !r.IsAdapter() && !isServed[name] {
			// Registered with no live worker: servable all the same, a
			// request waits for a worker to start (docs/capacity.md).
			add(schemas.Model{ID: name, Object: "model", Created: now, OwnedBy: "tokenbus", Root: name})
		}
	}
	for name, r := range byName {
		if r.IsAdapter() && !isServed[name] {
			if _, registered := byName[r.Base]; isServed[r.Base] || registered {
				add(schemas.Model{ID: name, Object: "model", Created: now, OwnedBy: "tokenbus", Root: name})
			}
		}
	}
	slices.SortFunc(out, func(a, b schemas.Model) int { return strings.Compare(a.ID, b.ID) })
	return out
}
