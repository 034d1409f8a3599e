package gateway

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

// Catalog tells the gateway which models exist and whether anything serves.
// NewCatalog makes the real one.
type Catalog interface {
	// Known reports whether model is registered, served by a live worker,
	// or one a live worker can switch to (docs/capacity.md).
	Known(model string) bool
	// Models lists the servable models, for /v1/models.
	Models() []schemas.Model
	// WorkersUp counts live workers, for /ready.
	WorkersUp() int
	// WorkersServing counts the live workers that can take a request now
	// (healthy, not draining, serving a model), for /ready.
	WorkersServing() int
}

// Registry is what the catalog reads of the model registry; registry.Cache
// implements it.
type Registry interface {
	// Known reports whether model is registered.
	Known(model string) bool
	// ModelList completes the /v1/models entries of what live workers
	// serve (id, and what workers tell: an adapter's parent, a base model's
	// max_model_len) with the registry's metadata, and adds the registered
	// adapters of the served base models. Any order.
	ModelList(served []schemas.Model) []schemas.Model
}

// NewCatalog answers from the live workers and the registry. reg may be nil
// (no registry: only what workers serve exists); pass a nil interface, not a
// nil *registry.Cache.
func NewCatalog(workers fleet.View, reg Registry) Catalog {
	return &catalog{workers: workers, reg: reg}
}

type catalog struct {
	workers fleet.View
	reg     Registry
}

// Known asks the registry first: a map lookup, where the fleet is a scan
// under the lock every routing decision takes.
func (c *catalog) Known(model string) bool {
	return c.reg != nil && c.reg.Known(model) || c.workers.Serving(model) > 0 || c.workers.Switchable(model) > 0
}

func (c *catalog) WorkersUp() int { return c.workers.Len() }

func (c *catalog) WorkersServing() int {
	n := 0
	for _, w := range c.workers.Workers() { // /ready is polled every few seconds: a copy is fine
		if w.Healthy && !w.Draining && len(w.Models) > 0 {
			n++
		}
	}
	return n
}

// Models lists what can be served now, as OpenAI model objects in vLLM's
// order (see orderModels): every model a live worker serves, with the
// registry's metadata where it has some, and the registered adapters of
// served base models (parent = base).
func (c *catalog) Models() []schemas.Model {
	served := servedModels(c.workers.Workers(), time.Now().Unix())
	if c.reg != nil {
		served = c.reg.ModelList(served)
	}
	return orderModels(served)
}

// servedModels is the entries for what live, healthy, non-draining workers
// serve, from their heartbeats alone: a base model's max_model_len is the
// smallest its workers report (a request that fits it fits every one of
// them); an adapter's parent is the first base model of a worker that has it
// loaded (vLLM's own default for an adapter loaded without a base name), and
// the registry, which knows better, replaces it.
func servedModels(workers []fleet.Worker, now int64) []schemas.Model {
	byID := map[string]int{}
	var out []schemas.Model
	for _, w := range workers {
		if w.Draining || !w.Healthy {
			continue
		}
		var firstBase string
		for _, m := range w.Models {
			if !slices.Contains(w.Adapters, m) {
				firstBase = m
				break
			}
		}
		// A model the worker can switch to is servable too (docs/capacity.md).
		for _, id := range w.CanServe {
			if _, seen := byID[id]; !seen {
				byID[id] = len(out)
				out = append(out, schemas.Model{ID: id, Object: "model", Created: now, OwnedBy: "tokenbus", Root: id})
			}
		}
		for _, id := range w.Models {
			i, seen := byID[id]
			if !seen {
				i = len(out)
				byID[id] = i
				out = append(out, schemas.Model{ID: id, Object: "model", Created: now, OwnedBy: "tokenbus", Root: id})
			}
			m := &out[i]
			if slices.Contains(w.Adapters, id) {
				if m.Parent == nil && firstBase != "" {
					m.Parent = &firstBase
				}
				continue
			}
			if n := w.MaxModelLen[id]; n > 0 && (m.MaxModelLen == 0 || n < m.MaxModelLen) {
				m.MaxModelLen = n
			}
		}
	}
	return out
}

// orderModels sorts a model list as vLLM lists its models: the base models
// first (by id), then the adapters of each base model in that order (by id),
// then adapters whose base is not listed. Tools that take the first model
// (guidellm did) then get a base model, never an adapter. An adapter without
// a max_model_len gets its base model's (it has the base's context; vLLM
// leaves it null).
func orderModels(ms []schemas.Model) []schemas.Model {
	lens := make(map[string]int, len(ms))
	for _, m := range ms {
		if m.Parent == nil {
			lens[m.ID] = m.MaxModelLen
		}
	}
	for i := range ms {
		if p := ms[i].Parent; p != nil && ms[i].MaxModelLen == 0 {
			ms[i].MaxModelLen = lens[*p]
		}
	}
	// Groups: base models, adapters of a listed base, the other adapters.
	group := func(m schemas.Model) (int, string) {
		switch _, listed := lens[deref(m.Parent)]; {
		case m.Parent == nil:
			return 0, ""
		case listed:
			return 1, *m.Parent
		}
		return 2, *m.Parent
	}
	slices.SortFunc(ms, func(a, b schemas.Model) int {
		ga, pa := group(a)
		gb, pb := group(b)
		return cmp.Or(cmp.Compare(ga, gb), strings.Compare(pa, pb), strings.Compare(a.ID, b.ID))
	})
	return ms
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// MaxModelLen is model's context length as /v1/models lists it (the
// registry's, else the smallest its workers report); 0 when not known. A
// scan of the list: for a Responses request's context check, not for
// every token.
func (c *catalog) MaxModelLen(model string) int {
	for _, m := range c.Models() {
		if m.ID == model {
			return m.MaxModelLen
		}
	}
	return 0
}
