package dispatcher

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Watch keeps t up to date from heartbeats on nc until ctx ends (loads as
// of the last heartbeat). Gateways without an embedded dispatcher use it; a
// Dispatcher feeds its own table in Run.
func Watch(ctx context.Context, nc *nats.Conn, t *Table) error {
	hb, err := nc.Subscribe(schemas.HeartbeatPrefix+"*", func(m *nats.Msg) {
		t.Heartbeat(m.Data, time.Now())
	})
	if err != nil {
		return err
	}
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		defer hb.Unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				t.Expire(now)
			}
		}
	}()
	return nil
}

// Catalog answers what exists and what can be served, from the live worker
// table and the registry cache (which may be nil).
type Catalog struct {
	Table    *Table
	Registry *registry.Cache
}

// Known reports whether model is registered or served by a live worker. The
// registry cache is asked first: a map lookup, where the table is a scan
// under the lock every routing decision takes.
func (c *Catalog) Known(model string) bool {
	return c.Registry != nil && c.Registry.Known(model) || c.Table.Serving(model) > 0
}

// WorkersUp is the number of live workers.
func (c *Catalog) WorkersUp() int { return c.Table.Len() }

// Models lists what can be served now, as OpenAI model objects: every model a
// live worker serves, with the registry's metadata where it has some, and the
// registered adapters of served base models (parent = base).
func (c *Catalog) Models() []schemas.Model {
	return c.Registry.ModelList(c.Table.Models())
}
