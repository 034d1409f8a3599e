package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// keyView is an API key as the admin API shows it: never its secret, except
// once in the answer to its creation.
type keyView struct {
	Object string `json:"object"` // "api_key"
	registry.Key
	Secret string `json:"key,omitempty"`
}

// POST /keys {"name","tenant","models","rpm","tpm","band","weight","max_queue_ms"}
func (s *Server) createKey(c *fiber.Ctx) error {
	var spec registry.KeySpec
	if err := decode(c, &spec); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	k, secret, err := s.cfg.Store.CreateKey(ctx, spec)
	if err != nil {
		return err
	}
	return c.Status(http.StatusCreated).JSON(keyView{Object: "api_key", Key: k, Secret: secret})
}

// PATCH /keys/{id} {"band","weight","max_queue_ms"}: a key's flow control
// (docs/scheduling.md); fields left out stay as they are. Every gateway and
// dispatcher drops its cached copy when the event reaches it.
func (s *Server) patchKey(c *fiber.Ctx) error {
	id := pathParam(c, "id")
	var p registry.FlowPolicy
	if err := decode(c, &p); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	k, err := s.cfg.Store.SetKeyFlow(ctx, id, p)
	if err != nil {
		return err
	}
	if err := registry.AnnounceKeys(s.cfg.NC, id); err != nil {
		s.log.Warn("could not announce a key change: gateways see it within their cache TTL", "key_id", id, "err", err)
	}
	return c.JSON(keyView{Object: "api_key", Key: k})
}

// GET /keys
func (s *Server) listKeys(c *fiber.Ctx) error {
	ctx, cancel := s.ctx()
	defer cancel()
	keys, err := s.cfg.Store.ListKeys(ctx)
	if err != nil {
		return err
	}
	out := make([]keyView, len(keys))
	for i, k := range keys {
		out[i] = keyView{Object: "api_key", Key: k}
	}
	return c.JSON(newList(out))
}

// DELETE /keys/{id}: the key stops working on every gateway as soon as the
// event reaches it, and its batches not yet ended are cancelled (their
// lines not yet run are answered key_revoked). batches_cancelled says how
// many; -1 if they could not be (the runners still stop their lines, as
// they ask whether a batch's key exists before each line).
//
// A deletion whose replicas did not confirm it in time answers 503, as
// every write that waits for replicas does, but the master deleted the key:
// it is announced and its batches cancelled all the same (a DELETE again
// answers 404). Any other error but 404 is announced too (the key may be
// gone: gateways read it again), and answered as it is.
func (s *Server) deleteKey(c *fiber.Ctx) error {
	id := pathParam(c, "id")
	ctx, cancel := s.ctx()
	defer cancel()
	err := s.cfg.Store.DeleteKey(ctx, id)
	if errors.Is(err, registry.ErrNotFound) {
		return err
	}
	if err := registry.AnnounceKeys(s.cfg.NC, id); err != nil {
		s.log.Warn("could not announce a key deletion: gateways forget it within their cache TTL", "key_id", id, "err", err)
	}
	if err != nil && !errors.Is(err, registry.ErrNotReplicated) {
		return err
	}
	out := fiber.Map{"id": id, "object": "api_key", "deleted": true}
	if s.cfg.Batches != nil {
		bctx, cancel := context.WithTimeout(context.Background(), keyBatchesTimeout)
		defer cancel()
		n, err := s.cfg.Batches.CancelKeyBatches(bctx, id)
		if err != nil {
			s.log.Warn("could not cancel a deleted key's batches: runners stop their lines before each one", "key_id", id, "cancelled", n, "err", err)
			n = -1
		}
		out["batches_cancelled"] = n
	}
	if err != nil {
		return err // not replicated: deleted on the master
	}
	return c.JSON(out)
}

// keyBatchesTimeout bounds the cancel of a deleted key's batches (a read of
// every batch record, then a write per batch of the key).
const keyBatchesTimeout = 30 * time.Second

// GET /usage?key_id=&model=: requests and tokens per key and model; an
// absent filter matches all.
func (s *Server) usage(c *fiber.Ctx) error {
	ctx, cancel := s.ctx()
	defer cancel()
	switch c.Query("by") {
	case "":
	case "hour":
		return s.usageHourly(c, ctx)
	default:
		return schemas.ErrInvalidValue.At("by", "by", `expected "hour" or nothing`)
	}
	rows, err := s.cfg.Store.Usage(ctx, c.Query("key_id"), c.Query("model"))
	if err != nil {
		return err
	}
	return c.JSON(newList(rows))
}

// usageHourly is GET /usage?by=hour[&hours=N]: usage per hour of the last N
// hours (default 24, at most the 192 the store keeps), this one included.
func (s *Server) usageHourly(c *fiber.Ctx, ctx context.Context) error {
	hours := 24
	if v := c.Query("hours"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > int(registry.UsageHourlyTTL/time.Hour) {
			return schemas.ErrInvalidValue.At("hours", "hours", "expected an integer from 1 to 192")
		}
		hours = n
	}
	now := time.Now()
	rows, err := s.cfg.Store.UsageHourly(ctx, c.Query("key_id"), c.Query("model"), now.Add(-time.Duration(hours-1)*time.Hour), now)
	if err != nil {
		return err
	}
	return c.JSON(newList(rows))
}
