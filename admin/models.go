package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Model status, from the live worker table.
const (
	StatusServing   = "serving"    // a base model some live worker serves
	StatusLoaded    = "loaded"     // an adapter loaded on some live worker
	StatusAvailable = "available"  // an adapter whose base is served: loaded on first use
	StatusNoWorkers = "no_workers" // nothing can serve it now (requests get 503)
)

// modelView is a registered model with its status.
type modelView struct {
	Object string `json:"object"` // "model"
	registry.Model
	Status  string   `json:"status"`
	Workers []string `json:"workers"` // live workers serving it (for an adapter: with it loaded)
}

// view adds status to registry models, from one listing of the live workers.
func (s *Server) view(models ...registry.Model) []modelView {
	serving := map[string][]string{}
	for _, w := range s.cfg.Fleet.Workers() {
		if w.Draining || !w.Healthy {
			continue
		}
		for _, m := range w.Models {
			serving[m] = append(serving[m], w.Worker)
		}
	}
	out := make([]modelView, 0, len(models))
	for _, m := range models {
		v := modelView{Object: "model", Model: m, Workers: serving[m.Name]}
		if v.Workers == nil {
			v.Workers = []string{}
		}
		switch {
		case !m.IsAdapter() && len(v.Workers) > 0:
			v.Status = StatusServing
		case m.IsAdapter() && len(v.Workers) > 0:
			v.Status = StatusLoaded
		case m.IsAdapter() && len(serving[m.Base]) > 0:
			v.Status = StatusAvailable
		default:
			v.Status = StatusNoWorkers
		}
		out = append(out, v)
	}
	return out
}

// GET /models
func (s *Server) listModels(c *fiber.Ctx) error {
	ctx, cancel := s.ctx()
	defer cancel()
	models, err := s.cfg.Store.Models(ctx)
	if err != nil {
		return err
	}
	return c.JSON(newList(s.view(models...)))
}

// GET /models/{name}
func (s *Server) getModel(c *fiber.Ctx) error {
	ctx, cancel := s.ctx()
	defer cancel()
	m, err := s.cfg.Store.Model(ctx, pathParam(c, "*"))
	if err != nil {
		return err
	}
	return c.JSON(s.view(m)[0])
}

// POST /models {"name","owned_by","max_model_len"}: create a base model or
// replace its metadata.
func (s *Server) putModel(c *fiber.Ctx) error {
	var req struct {
		Name        string `json:"name"`
		OwnedBy     string `json:"owned_by"`
		MaxModelLen int    `json:"max_model_len"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	created, err := s.cfg.Store.PutBase(ctx, registry.Model{Name: req.Name, OwnedBy: req.OwnedBy, MaxModelLen: req.MaxModelLen})
	if err != nil {
		return err
	}
	return s.answerPut(c, ctx, req.Name, created)
}

// POST /adapters {"name","base","path"}: register a LoRA adapter.
func (s *Server) putAdapter(c *fiber.Ctx) error {
	var req struct {
		Name string `json:"name"`
		Base string `json:"base"`
		Path string `json:"path"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	created, err := s.cfg.Store.PutAdapter(ctx, registry.Model{Name: req.Name, Base: req.Base, Path: req.Path})
	if err != nil {
		return err
	}
	return s.answerPut(c, ctx, req.Name, created)
}

// answerPut announces a written model and answers with it: 201 if created.
func (s *Server) answerPut(c *fiber.Ctx, ctx context.Context, name string, created bool) error {
	s.announceModels(name)
	m, err := s.cfg.Store.Model(ctx, name)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.Status(status).JSON(s.view(m)[0])
}

// deleted is the answer to a DELETE of a model or adapter.
type deleted struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"` // "model"
	Deleted bool     `json:"deleted"`
	Removed []string `json:"removed"` // the model, then adapters deleted with it
	Unload  []unload `json:"unload"`  // adapters unloaded from workers
}

// unload is the outcome of unloading one adapter from one worker.
type unload struct {
	Worker  string         `json:"worker"`
	Adapter string         `json:"adapter"`
	OK      bool           `json:"ok"`
	Error   *schemas.Error `json:"error,omitempty"`
}

// DELETE /models/{name}[?force=true]: a base model with adapters needs force,
// which deletes (and unloads) its adapters too.
func (s *Server) deleteModel(c *fiber.Ctx) error {
	force := false
	if v := c.Query("force"); v != "" {
		switch v {
		case "true", "1":
			force = true
		case "false", "0":
		default:
			return schemas.ErrInvalidType.At("force", "force", "true or false", strconv.Quote(v))
		}
	}
	ctx, cancel := s.ctx()
	defer cancel()
	name := pathParam(c, "*")
	removed, err := s.cfg.Store.RemoveModel(ctx, name, force)
	if err != nil {
		return err
	}
	return c.JSON(s.removed(name, removed))
}

// DELETE /adapters/{name}: unregister an adapter and unload it everywhere.
func (s *Server) deleteAdapter(c *fiber.Ctx) error {
	ctx, cancel := s.ctx()
	defer cancel()
	name := pathParam(c, "*")
	m, err := s.cfg.Store.RemoveAdapter(ctx, name)
	if err != nil {
		return err
	}
	return c.JSON(s.removed(name, []registry.Model{m}))
}

// removed announces deleted models and unloads the adapters among them from
// every live worker that has them loaded; it returns the answer.
func (s *Server) removed(name string, models []registry.Model) deleted {
	d := deleted{ID: name, Object: "model", Deleted: true, Unload: []unload{}}
	var adapters []string
	for _, m := range models {
		d.Removed = append(d.Removed, m.Name)
		if m.IsAdapter() {
			adapters = append(adapters, m.Name)
		}
	}
	// Announce first: dispatchers stop routing to the adapters, so workers
	// are not asked to load them again while they unload.
	s.announceModels(name)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, w := range s.cfg.Fleet.Workers() {
		for _, a := range adapters {
			if !slices.Contains(w.Models, a) && !slices.Contains(w.Adapters, a) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				u := unload{Worker: w.Worker, Adapter: a}
				u.Error = s.control(w.Worker, schemas.CtlUnloadAdapter, schemas.AdapterRequest{Name: a})
				u.OK = u.Error == nil
				if !u.OK {
					s.log.Warn("adapter unload failed", "worker", w.Worker, "adapter", a, "err", u.Error)
				}
				mu.Lock()
				d.Unload = append(d.Unload, u)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	slices.SortFunc(d.Unload, func(a, b unload) int {
		return cmp.Or(strings.Compare(a.Worker, b.Worker), strings.Compare(a.Adapter, b.Adapter))
	})
	return d
}

// announceModels tells caches the models changed; registry.Announce flushes,
// so the event is on its way before the response.
func (s *Server) announceModels(name string) {
	if err := registry.Announce(s.cfg.NC, name); err != nil {
		// Caches still resync on their timer.
		s.log.Warn("could not announce a model change", "model", name, "err", err)
	}
}

// control sends a control request to a worker and waits for its CtlReply.
func (s *Server) control(worker, op string, body any) *schemas.Error {
	b, _ := json.Marshal(body)
	msg, err := s.cfg.NC.Request(schemas.CtlSubject(worker, op), b, s.cfg.CtlTimeout)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return schemas.ErrWorkerUnreachable.New(worker, "it is gone")
	case errors.Is(err, nats.ErrTimeout):
		return schemas.ErrWorkerCtlTimeout.New(worker, op, s.cfg.CtlTimeout)
	case err != nil:
		return schemas.ErrWorkerUnreachable.New(worker, err)
	}
	return schemas.ReadCtlReply(msg.Data, worker, op)
}
