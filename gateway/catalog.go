package gateway

import (
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

// Catalog tells the gateway which models exist and whether anything serves.
// NewCatalog makes the real one.
type Catalog interface {
	// Known reports whether model is registered or served by a live worker.
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
	// ModelList is the /v1/models list for the models live workers serve:
	// those, with the registry's metadata, and the registered adapters of the
	// served base models.
	ModelList(served []string) []schemas.Model
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
	return c.reg != nil && c.reg.Known(model) || c.workers.Serving(model) > 0
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

// Models lists what can be served now, as OpenAI model objects: every model a
// live worker serves, with the registry's metadata where it has some, and the
// registered adapters of served base models (parent = base).
func (c *catalog) Models() []schemas.Model {
	served := c.workers.Models()
	if c.reg != nil {
		return c.reg.ModelList(served)
	}
	now := time.Now().Unix()
	out := make([]schemas.Model, 0, len(served))
	for _, name := range served { // sorted already
		out = append(out, schemas.Model{ID: name, Object: "model", Created: now, OwnedBy: "tokenbus", Root: name})
	}
	return out
}
