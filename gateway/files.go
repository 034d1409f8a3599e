package gateway

import (
	"context"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/schemas"
)

// The Files API (POST, GET /v1/files; GET, DELETE /v1/files/{id}; GET
// /v1/files/{id}/content), on the batch package's store. Uploads:
// uploads.go.

// filesRoutes mounts the Files and Batches APIs.
func (g *Gateway) filesRoutes(app *fiber.App) {
	app.Post("/v1/files", g.uploadFile)
	app.Get("/v1/files", g.listFiles)
	app.Get("/v1/files/:id", g.getFile)
	app.Delete("/v1/files/:id", g.deleteFile)
	app.Get("/v1/files/:id/content", g.fileContent)
	app.Post("/v1/batches", g.createBatch)
	app.Get("/v1/batches", g.listBatches)
	app.Get("/v1/batches/:id", g.getBatch)
	app.Post("/v1/batches/:id/cancel", g.cancelBatch)
}

// caller authenticates a Files or Batches request (no rate limit: these
// are cheap; the lines a batch runs are counted as they run).
func (g *Gateway) caller(c *fiber.Ctx) (Principal, error) {
	if g.cfg.Identify == nil {
		return Principal{}, nil
	}
	p, err := g.cfg.Identify(c)
	return Principal{Tenant: strings.Clone(p.Tenant), KeyID: strings.Clone(p.KeyID)}, err
}

// storeTimeout bounds one call to the store.
const storeTimeout = 30 * time.Second

// storeCtx bounds one call to the store.
func (g *Gateway) storeCtx(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(g.base, storeTimeout)
}

// listQuery reads after, limit and order.
func listQuery(c *fiber.Ctx, maxLimit int) (batch.ListQuery, error) {
	q := batch.ListQuery{After: c.Query("after"), Purpose: c.Query("purpose")}
	if v := c.Query("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return q, schemas.ErrInvalidValue.At("limit", "limit", "an integer from 1 to "+strconv.Itoa(maxLimit))
		}
		q.Limit = n
	}
	switch c.Query("order") {
	case "", "desc":
	case "asc":
		q.Asc = true
	default:
		return q, schemas.ErrInvalidValue.At("order", "order", "'asc' or 'desc'")
	}
	return q, nil
}

func (g *Gateway) listFiles(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	q, err := listQuery(c, 10_000)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	l, err := g.cfg.Batches.Files(ctx, p.Tenant, q)
	if err != nil {
		return err
	}
	return c.JSON(l)
}

func (g *Gateway) getFile(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	f, err := g.cfg.Batches.File(ctx, p.Tenant, pathParam(c, "id"))
	if err != nil {
		return err
	}
	return c.JSON(f)
}

func (g *Gateway) deleteFile(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	id := pathParam(c, "id")
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	if err := g.cfg.Batches.DeleteFile(ctx, p.Tenant, id); err != nil {
		return err
	}
	return c.JSON(batch.FileDeleted{ID: id, Object: "file", Deleted: true})
}

// fileContent streams a file: fasthttp reads the object store's chunks as
// it writes them to the client, never the whole file at once.
func (g *Gateway) fileContent(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	// Not storeCtx: the body is written after the handler returns, for as
	// long as the client takes to read it (bounded by the gateway's base
	// context: shutdown cuts it).
	r, f, err := g.cfg.Batches.OpenFile(g.base, p.Tenant, pathParam(c, "id"))
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, "application/octet-stream")
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+headerSafe(f.Filename)+`"`)
	c.Context().SetBodyStream(readCloser{r}, int(f.Bytes))
	return nil
}

// headerSafe is a client's file name fit for a quoted header value:
// printable ASCII without quotes or backslashes.
func headerSafe(name string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e || r == '"' || r == '\\' {
			return '_'
		}
		return r
	}, name)
}

// readCloser lets fasthttp close the object's reader when the body is sent.
type readCloser struct{ io.ReadCloser }
