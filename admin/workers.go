package admin

import (
	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

// GET /workers: the live worker table, from heartbeats. Each row is the
// worker's last heartbeat (models, adapters loaded, running, waiting,
// max_concurrency, kv_cache_usage, draining, healthy, engine, version; for a
// worker of several models can_serve, switching, loaded_at, hold_ms) with
// the load estimate and when it was last heard from.
func (s *Server) listWorkers(c *fiber.Ctx) error {
	return c.JSON(newList(s.cfg.Fleet.Workers()))
}

// drained is the answer to a drain.
type drained struct {
	Worker   string `json:"worker"`
	Draining bool   `json:"draining"`
}

// POST /workers/{id}/drain: the worker stops taking requests, finishes what
// it runs and leaves the table.
func (s *Server) drainWorker(c *fiber.Ctx) error {
	id := pathParam(c, "id")
	if !s.live(id) {
		return schemas.ErrWorkerNotFound.New(id)
	}
	if e := s.control(id, schemas.CtlDrain, struct{}{}); e != nil {
		return e
	}
	return c.JSON(drained{Worker: id, Draining: true})
}

func (s *Server) live(id string) bool {
	for _, w := range s.cfg.Fleet.Workers() {
		if w.Worker == id {
			return true
		}
	}
	return false
}

// switchLister is a fleet view that remembers model switches (*fleet.Fleet).
type switchLister interface{ Switches() []fleet.Switch }

// GET /workers/switches: the model switches the gateway's fleet saw lately
// in heartbeats, newest first (docs/capacity.md).
func (s *Server) listSwitches(c *fiber.Ctx) error {
	var out []fleet.Switch
	if l, ok := s.cfg.Fleet.(switchLister); ok {
		out = l.Switches()
	}
	return c.JSON(newList(out))
}

// POST /workers/{id}/switch {"model": ...}: the worker loads model in place
// of the one it serves, as a dispatcher would have it do for requests that
// wait (the worker's hold and drain apply). The answer comes once the
// worker accepted: its heartbeats tell when it serves the model.
func (s *Server) switchWorker(c *fiber.Ctx) error {
	id := pathParam(c, "id")
	var req struct {
		Model string `json:"model"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	if !s.live(id) {
		return schemas.ErrWorkerNotFound.New(id)
	}
	if e := s.control(id, schemas.CtlSwitch, schemas.SwitchRequest{Model: req.Model, Dispatcher: "admin"}); e != nil {
		return e
	}
	return c.JSON(switching{Worker: id, Switching: req.Model})
}

// switching is the answer to a switch.
type switching struct {
	Worker    string `json:"worker"`
	Switching string `json:"switching"`
}
