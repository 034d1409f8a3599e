package registry

import (
	"slices"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// ModelList is the /v1/models list: every model in served (what live workers
// serve now), with the registry's metadata where it has some, and every
// registered adapter whose base model is served, since a worker of the base
// loads it on demand. Adapters have parent = their base and root = their
// weights' path, as in vLLM. Sorted by id. c may be nil (no registry).
func (c *Cache) ModelList(served []string) []schemas.Model {
	now := time.Now().Unix()
	byName := map[string]Model{}
	if c != nil {
		c.mu.RLock()
		byName = c.models
		c.mu.RUnlock() // the map is replaced on refresh, never written to
	}
	isServed := make(map[string]bool, len(served))
	for _, name := range served {
		isServed[name] = true
	}
	out := make([]schemas.Model, 0, len(served))
	add := func(name string) {
		m := schemas.Model{ID: name, Object: "model", Created: now, OwnedBy: "tokenbus", Root: name}
		if r, ok := byName[name]; ok {
			m.Created, m.MaxModelLen = r.Created, r.MaxModelLen
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
	for _, name := range served {
		add(name)
	}
	for name, r := range byName {
		if r.IsAdapter() && isServed[r.Base] && !isServed[name] {
			add(name)
		}
	}
	slices.SortFunc(out, func(a, b schemas.Model) int { return strings.Compare(a.ID, b.ID) })
	return out
}
