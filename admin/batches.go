package admin

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// GET /batches[?active=true]: every tenant's batches, newest first, with
// their tenant, model and lines still queued.
func (s *Server) listBatches(c *fiber.Ctx) error {
	if s.cfg.Batches == nil {
		return schemas.ErrBatchesOff.New("this gateway serves no batches (--batches=false, or JetStream is unavailable)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	list, err := s.cfg.Batches.AdminBatches(ctx, c.Query("active") == "true")
	if err != nil {
		return err
	}
	return c.JSON(newList(list))
}
