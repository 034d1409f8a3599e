package admin

import (
	"io"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/schemas"
)

// GET /batches[?active=true]: every tenant's batches, newest first, with
// their tenant, model and lines still queued.
func (s *Server) listBatches(c *fiber.Ctx) error {
	if s.cfg.Batches == nil {
		return errBatchesOff()
	}
	ctx, cancel := s.ctx()
	defer cancel()
	list, err := s.cfg.Batches.AdminBatches(ctx, c.Query("active") == "true")
	if err != nil {
		return err
	}
	return c.JSON(newList(list))
}

func errBatchesOff() error {
	return schemas.ErrBatchesOff.New("this gateway serves no batches (--batches=false, or JetStream is unavailable)")
}

// POST /batches/{id}/cancel: cancels any tenant's batch, as the batch's own
// tenant would on the OpenAI API (the console's cancel button: the OpenAI
// routes need the tenant's API key, which the operator does not hold).
func (s *Server) cancelBatch(c *fiber.Ctx) error {
	if s.cfg.Batches == nil {
		return errBatchesOff()
	}
	ctx, cancel := s.ctx()
	defer cancel()
	id := pathParam(c, "id")
	tenant, err := s.cfg.Batches.BatchTenant(ctx, id)
	if err != nil {
		return err
	}
	b, err := s.cfg.Batches.CancelBatch(ctx, tenant, id)
	if err != nil {
		return err
	}
	return c.JSON(b)
}

// GET /batches/{id}/output, GET /batches/{id}/errors: the content of any
// tenant's batch's output (or error) file; 404 file_not_found while it has
// none.
func (s *Server) batchOutput(c *fiber.Ctx) error {
	return s.batchFile(c, "output", func(b batch.Batch) *string { return b.OutputFileID })
}

func (s *Server) batchErrors(c *fiber.Ctx) error {
	return s.batchFile(c, "errors", func(b batch.Batch) *string { return b.ErrorFileID })
}

func (s *Server) batchFile(c *fiber.Ctx, what string, which func(batch.Batch) *string) error {
	if s.cfg.Batches == nil {
		return errBatchesOff()
	}
	ctx, cancel := s.ctx()
	defer cancel()
	id := pathParam(c, "id")
	tenant, err := s.cfg.Batches.BatchTenant(ctx, id)
	if err != nil {
		return err
	}
	b, err := s.cfg.Batches.Batch(ctx, tenant, id)
	if err != nil {
		return err
	}
	fid := which(b)
	if fid == nil || *fid == "" {
		return schemas.ErrFileNotFound.New(id + " " + what)
	}
	// s.base, not ctx: the body is written after the handler returns, for as
	// long as the client takes to read it; shutdown cuts it.
	r, f, err := s.cfg.Batches.OpenFile(s.base, tenant, *fid)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, "application/jsonl")
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+*fid+`.jsonl"`)
	c.Context().SetBodyStream(readCloser{r}, int(f.Bytes))
	return nil
}

// readCloser lets fasthttp close the object's reader when the body is sent.
type readCloser struct{ io.ReadCloser }
