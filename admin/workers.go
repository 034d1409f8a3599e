package admin

import (
	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// GET /workers: the live worker table, from heartbeats. Each row is the
// worker's last heartbeat (models, adapters loaded, running, waiting,
// max_concurrency, kv_cache_usage, draining, healthy, engine, version) with
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
