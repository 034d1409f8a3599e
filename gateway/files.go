package gateway

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/schemas"
)

// The Files API (POST, GET /v1/files; GET, DELETE /v1/files/{id}; GET
// /v1/files/{id}/content), on the batch package's store.
//
// An upload is not held in memory: fasthttp reads a multipart body of
// known length part by part, keeping at most 16 MiB of a file in memory and
// the rest in a temporary file, and the handler streams the part into the
// object store in chunks. Only POST /v1/files gets FileLimit rather than
// BodyLimit (uploadHook, fasthttp's per-request limit), and only with a
// Content-Length: a chunked upload would be buffered whole, so it keeps
// BodyLimit.

// multipartSlack is what a multipart body may have beyond its file: the
// boundaries, part headers and the purpose field.
const multipartSlack = 64 << 10

// uploadHook is fasthttp's HeaderReceived: FramingHook for every request,
// and the file size limit for an upload of known length.
func (g *Gateway) uploadHook(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	rc := FramingHook(h)
	// Byte comparisons: this runs for every request, and allocates nothing.
	if g.cfg.Batches != nil && h.ContentLength() > 0 && bytes.Equal(h.Method(), methodPost) &&
		bytes.Equal(bytes.TrimSuffix(h.RequestURI(), slash), filesPath) {
		rc.MaxRequestBodySize = int(g.cfg.FileLimit) + multipartSlack
	}
	return rc
}

var (
	methodPost = []byte(fiber.MethodPost)
	slash      = []byte("/")
	filesPath  = []byte("/v1/files")
)

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

// storeCtx bounds one call to the store.
func (g *Gateway) storeCtx(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(g.base, 30*time.Second)
}

func (g *Gateway) uploadFile(c *fiber.Ctx) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(c.Get(fiber.HeaderContentType), fiber.MIMEMultipartForm) {
		return schemas.ErrBadUpload.New("POST /v1/files takes multipart/form-data with a 'file' part and a 'purpose' field.")
	}
	form, err := c.MultipartForm()
	if err != nil {
		return schemas.ErrBadUpload.New("The multipart/form-data body could not be read.")
	}
	purpose := ""
	if v := form.Value["purpose"]; len(v) > 0 {
		purpose = v[0]
	}
	switch {
	case purpose == "":
		return schemas.ErrMissingParam.At("purpose", "purpose")
	case purpose != "batch":
		return schemas.ErrInvalidValue.At("purpose", "purpose", "only 'batch' is supported")
	case len(form.File["file"]) == 0:
		return schemas.ErrMissingParam.At("file", "file")
	}
	fh := form.File["file"][0]
	if fh.Size > g.cfg.FileLimit {
		return schemas.ErrFileTooLarge.New(g.cfg.FileLimit)
	}
	r, err := fh.Open()
	if err != nil {
		return schemas.ErrBadUpload.New("The file part could not be read.")
	}
	defer func() { _ = r.Close() }()
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	f, err := g.cfg.Batches.PutFile(ctx, p.Tenant, fh.Filename, purpose, r, g.cfg.FileLimit)
	if err != nil {
		return err
	}
	return c.JSON(f)
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
