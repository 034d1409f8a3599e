package gateway

import (
	"encoding/json"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/schemas"
)

// The Batches API (POST, GET /v1/batches; GET /v1/batches/{id}; POST
// /v1/batches/{id}/cancel), on the batch package's store. The runners
// (batch.Runner) do the work; these only read and write batch records.

func (g *Gateway) createBatch(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	if !isJSON(c.Get(fiber.HeaderContentType)) {
		return errUnsupportedMediaType
	}
	var req batch.CreateRequest
	if err := json.Unmarshal(c.Body(), &req); err != nil {
		return schemas.ErrBodyNotJSON.New("not a batch request object")
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	b, err := g.cfg.Batches.CreateBatch(ctx, p.Tenant, p.KeyID, req)
	if err != nil {
		return err
	}
	return c.JSON(b)
}

func (g *Gateway) getBatch(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	b, err := g.cfg.Batches.Batch(ctx, p.Tenant, pathParam(c, "id"))
	if err != nil {
		return err
	}
	return c.JSON(b)
}

func (g *Gateway) listBatches(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	q, err := listQuery(c, 100)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	l, err := g.cfg.Batches.Batches(ctx, p.Tenant, q)
	if err != nil {
		return err
	}
	return c.JSON(l)
}

func (g *Gateway) cancelBatch(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	b, err := g.cfg.Batches.CancelBatch(ctx, p.Tenant, pathParam(c, "id"))
	if err != nil {
		return err
	}
	return c.JSON(b)
}
