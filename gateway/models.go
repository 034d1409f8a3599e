package gateway

import (
	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// modelList is OpenAI's list object.
type modelList struct {
	Object string          `json:"object"`
	Data   []schemas.Model `json:"data"`
}

// listModels handles GET .../models: every servable model.
func (g *Gateway) listModels(c *fiber.Ctx) error {
	models := g.cat.Models()
	if models == nil {
		models = []schemas.Model{}
	}
	for i := range models {
		fillModel(&models[i])
	}
	return c.JSON(modelList{Object: "list", Data: models})
}

// getModel handles GET .../models/{id}; the id may contain '/'.
func (g *Gateway) getModel(c *fiber.Ctx) error {
	id := pathParam(c, "*")
	if id != "" {
		for _, m := range g.cat.Models() {
			if m.ID == id {
				fillModel(&m)
				c.Locals(localLabel, id)
				return c.JSON(m)
			}
		}
	}
	return schemas.ErrModelNotFound.New(id)
}

func fillModel(m *schemas.Model) {
	if m.Object == "" {
		m.Object = "model"
	}
	if m.OwnedBy == "" {
		m.OwnedBy = "tokenbus"
	}
}

// health answers while the process serves HTTP.
func (g *Gateway) health(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// ready answers 200 when requests can be served: NATS connected, a worker
// up, not shutting down; else 503 in OpenAI's shape.
func (g *Gateway) ready(c *fiber.Ctx) error {
	switch {
	case g.draining.Load():
		return errShuttingDown
	case g.nc == nil || !g.nc.IsConnected():
		return schemas.ErrNotConnected.New()
	}
	n := g.cat.WorkersUp()
	if n <= 0 {
		return schemas.ErrNoWorkerUp.New()
	}
	return c.JSON(fiber.Map{"status": "ready", "workers": n, "version": g.cfg.Version})
}
