package gateway

import (
	"slices"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// modelList is OpenAI's list object.
type modelList struct {
	Object string          `json:"object"`
	Data   []schemas.Model `json:"data"`
}

// listModels handles GET .../models: every servable model the caller may
// use.
func (g *Gateway) listModels(c *fiber.Ctx) error {
	allowed, err := g.modelAccess(c)
	if err != nil {
		return err
	}
	models := g.cat.Models()
	if allowed != nil {
		models = slices.DeleteFunc(models, func(m schemas.Model) bool { return !allowed(m.ID) })
	}
	if models == nil {
		models = []schemas.Model{}
	}
	for i := range models {
		fillModel(&models[i])
	}
	return c.JSON(modelList{Object: "list", Data: models})
}

// getModel handles GET .../models/{id}; the id may contain '/'. A model the
// caller may not use is not found (its existence is not revealed).
func (g *Gateway) getModel(c *fiber.Ctx) error {
	allowed, err := g.modelAccess(c)
	if err != nil {
		return err
	}
	id := pathParam(c, "*")
	if id != "" && (allowed == nil || allowed(id)) {
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

// modelAccess asks Config.ModelAccess; nil allowed means all.
func (g *Gateway) modelAccess(c *fiber.Ctx) (func(string) bool, error) {
	if g.cfg.ModelAccess == nil {
		return nil, nil
	}
	return g.cfg.ModelAccess(c)
}

func fillModel(m *schemas.Model) {
	if m.Object == "" {
		m.Object = "model"
	}
	if m.OwnedBy == "" {
		m.OwnedBy = "tokenbus"
	}
}

// version answers GET /version as vLLM does: {"version":"<version>"},
// here tokenbus's (the binary's, as `tokenbus version` prints it).
func (g *Gateway) version(c *fiber.Ctx) error {
	return c.JSON(versionBody{Version: g.cfg.Version})
}

type versionBody struct {
	Version string `json:"version"`
}

// health answers while the process serves HTTP.
func (g *Gateway) health(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// ready answers 200 when requests can be served: NATS connected, a live
// worker healthy, not draining and serving a model (unless
// ReadyWithoutWorkers), not shutting down; else 503 in OpenAI's shape. A worker whose engine is unhealthy heartbeats on:
// up is not enough.
func (g *Gateway) ready(c *fiber.Ctx) error {
	switch {
	case g.draining.Load():
		return errShuttingDown
	case g.nc == nil || !g.nc.IsConnected():
		return schemas.ErrNotConnected.New()
	}
	n := g.cat.WorkersUp()
	if g.cfg.ReadyWithoutWorkers {
		return c.JSON(fiber.Map{"status": "ready", "workers": n, "serving": g.cat.WorkersServing(), "version": g.cfg.Version})
	}
	if n <= 0 {
		return schemas.ErrNoWorkerUp.New()
	}
	serving := g.cat.WorkersServing()
	if serving <= 0 {
		return schemas.ErrNoWorkerServing.New(n)
	}
	return c.JSON(fiber.Map{"status": "ready", "workers": n, "serving": serving, "version": g.cfg.Version})
}
