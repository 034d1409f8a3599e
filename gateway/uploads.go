package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime/multipart"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/schemas"
)

// Uploads are admitted before their body is read. The server streams
// request bodies (fasthttp's StreamRequestBody, multipart pre-parsing off):
// every request but an upload has its body read here, before any handler,
// up to BodyLimit, exactly as fasthttp did (bufferBodies); an upload's
// handler first checks the API key (the key cache), the upload limits (in
// all and per tenant, on this gateway), the file limit and the tenant's
// quota against the Content-Length, and only then reads the body: its
// multipart parts one after the other, the file part streamed into the
// object store in 128 KiB chunks. Nothing is written to disk here.
//
// Memory per upload, bounded whatever the client sends: fasthttp's read
// buffer and the first 8 KiB of the body, the multipart reader's 4 KiB
// buffer, the object store's 128 KiB chunk, and at most multipartSlack of
// part headers and small fields (the budget below). A refused upload is
// answered after its body is drained for at most 2 s (drainBody, so that
// the client reads the answer rather than a reset), then its connection
// is closed: an unread body must never be read as a next request.

// multipartSlack is what a multipart body may have beyond its file: the
// boundaries, part headers and the purpose field.
const multipartSlack = 64 << 10

var (
	methodPost = []byte(fiber.MethodPost)
	filesPath  = []byte("/v1/files")
)

// isUpload reports whether ctx is POST /v1/files as Fiber routes it
// (path case-insensitive, one trailing slash or none).
func (g *Gateway) isUpload(ctx *fasthttp.RequestCtx) bool {
	return g.cfg.Batches != nil && uploadRoute(ctx.Method(), ctx.URI().PathOriginal())
}

func uploadRoute(method, path []byte) bool {
	if !bytes.Equal(method, methodPost) {
		return false
	}
	if len(path) > len(filesPath) && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	return bytes.EqualFold(path, filesPath)
}

// uploadHook is fasthttp's HeaderReceived: FramingHook for every request,
// and for an upload a body limit of 1 byte, which makes fasthttp hand it to
// its handler as a stream after its first bytes rather than after the 8 KiB
// it reads ahead of other bodies. No allocation: it runs for every request.
func (g *Gateway) uploadHook(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	rc := FramingHook(h)
	if g.cfg.Batches != nil && h.ContentLength() > 0 {
		path := h.RequestURI()
		if i := bytes.IndexByte(path, '?'); i >= 0 {
			path = path[:i]
		}
		if uploadRoute(h.Method(), path) {
			rc.MaxRequestBodySize = 1
		}
	}
	return rc
}

// bufferBodies wraps the server's handler: it reads every request body but
// an upload's to its end before the handler runs, bounded by BodyLimit
// (past it fasthttp's 413, as without streaming), so that handlers see a
// body in memory as they always did.
func (g *Gateway) bufferBodies(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if !ctx.Request.IsBodyStream() || g.isUpload(ctx) {
			next(ctx)
			return
		}
		if err := readBody(&ctx.Request, g.cfg.BodyLimit); err != nil {
			ctx.SetConnectionClose()
			g.app.Server().ErrorHandler(ctx, err)
			return
		}
		next(ctx)
	}
}

// readBody reads a streamed request body into the request, at most limit
// bytes: fasthttp.ErrBodyTooLarge past it.
func readBody(req *fasthttp.Request, limit int) error {
	n := req.Header.ContentLength()
	if n > limit {
		return fasthttp.ErrBodyTooLarge
	}
	buf := bytebufferpool.Get()
	defer bytebufferpool.Put(buf)
	if _, err := buf.ReadFrom(io.LimitReader(req.BodyStream(), int64(limit)+1)); err != nil {
		return err
	}
	if len(buf.B) > limit {
		return fasthttp.ErrBodyTooLarge
	}
	if n >= 0 && len(buf.B) != n {
		return io.ErrUnexpectedEOF
	}
	req.SetBody(buf.B) // copies, and releases the stream
	return nil
}

// uploadGate bounds the uploads this gateway reads at once, in all and per
// tenant.
type uploadGate struct {
	mu        sync.Mutex
	total     int
	max, each int
	tenants   map[string]int
}

// reading is the number of uploads being read now.
func (u *uploadGate) reading() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

// enter admits one upload of tenant, or says why not (429 for the tenant's
// own limit, 503 for the gateway's); leave is called once it has ended.
func (u *uploadGate) enter(tenant string) (leave func(), err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.tenants[tenant] >= u.each:
		return nil, schemas.ErrTooManyUploads.New(u.each)
	case u.total >= u.max:
		return nil, schemas.ErrUploadsBusy.New(u.max)
	}
	if u.tenants == nil {
		u.tenants = map[string]int{}
	}
	u.total++
	u.tenants[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.total--
			if u.tenants[tenant]--; u.tenants[tenant] <= 0 {
				delete(u.tenants, tenant)
			}
		})
	}, nil
}

// uploadFile is POST /v1/files: admitted on its headers, then streamed.
func (g *Gateway) uploadFile(c *fiber.Ctx) error {
	ctx := c.Context()
	body := &bodyReader{}
	if ctx.Request.IsBodyStream() {
		body.r = ctx.RequestBodyStream()
	} else {
		body.r = bytes.NewReader(ctx.Request.Body()) // a path Fiber routes here that bufferBodies did not know
		body.whole = true
	}
	err := g.upload(c, body)
	if !body.eof {
		// Bytes of this body are still unread: they must not be taken for
		// the next request. Drain what the client is sending (bounded) so
		// that it reads the answer, then close.
		ctx.SetConnectionClose()
		if !body.whole {
			drainBody(ctx.Conn(), ctx.Request.Header.ContentLength())
		}
	}
	return err
}

func (g *Gateway) upload(c *fiber.Ctx, body *bodyReader) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	h := &c.Context().Request.Header
	boundary := string(h.MultipartFormBoundary())
	switch {
	case !strings.HasPrefix(string(h.ContentType()), fiber.MIMEMultipartForm) || boundary == "":
		return schemas.ErrBadUpload.New("POST /v1/files takes multipart/form-data with a 'file' part and a 'purpose' field.")
	case len(h.Peek(fiber.HeaderContentEncoding)) > 0 && !strings.EqualFold(string(h.Peek(fiber.HeaderContentEncoding)), "identity"):
		return schemas.ErrBadUpload.New("An upload may not have a Content-Encoding.")
	}
	length := int64(h.ContentLength()) // -1 chunked
	if length > g.cfg.FileLimit+multipartSlack {
		return schemas.ErrFileTooLarge.New(g.cfg.FileLimit)
	}
	leave, err := g.uploads.enter(p.Tenant)
	if err != nil {
		return err
	}
	defer leave()
	// The whole upload, body included: ReadTimeout bounds the client, this
	// the store.
	sctx, cancel := context.WithTimeout(g.base, g.cfg.ReadTimeout+storeTimeout)
	defer cancel()
	up, err := g.cfg.Batches.AdmitUpload(sctx, p.Tenant, max(length-multipartSlack, 0))
	if err != nil {
		return err
	}
	defer up.Close()

	// Past the file part's own bytes, the body may hold multipartSlack
	// more (boundaries, headers, fields): the budget, raised by every byte
	// of the file part handed on.
	budget := &budgetReader{r: body, left: multipartSlack}
	mr := multipart.NewReader(budget, boundary)
	purpose, stored := "", false
	var file batch.File
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return uploadReadError(err)
		}
		switch part.FormName() {
		case "purpose":
			v, err := io.ReadAll(io.LimitReader(part, maxPurpose))
			if err != nil {
				return uploadReadError(err)
			}
			// Refused at once when it comes before the file; after it,
			// the check below removes the file again.
			if purpose = string(v); !stored && checkPurpose(purpose) != nil {
				return checkPurpose(purpose)
			}
		case "file":
			if stored {
				return schemas.ErrBadUpload.New("An upload has one 'file' part.")
			}
			// Stored as purpose 'batch', the only one served: a purpose
			// field after the file that says otherwise removes it.
			if file, err = up.Put(sctx, part.FileName(), "batch", &partReader{p: part, budget: budget}, g.cfg.FileLimit); err != nil {
				return err
			}
			stored = true
		default:
			if _, err := io.Copy(io.Discard, part); err != nil {
				return uploadReadError(err)
			}
		}
	}
	// The epilogue, if any: the body is read to its end, so the connection
	// may serve the next request.
	if _, err := io.Copy(io.Discard, budget); err != nil {
		return uploadReadError(err)
	}
	var bad error
	switch {
	case purpose == "":
		bad = schemas.ErrMissingParam.At("purpose", "purpose")
	case !stored:
		bad = schemas.ErrMissingParam.At("file", "file")
	default:
		bad = checkPurpose(purpose)
	}
	if bad != nil {
		if stored {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(sctx), storeTimeout)
			defer cancel()
			_ = g.cfg.Batches.DeleteFile(dctx, p.Tenant, file.ID)
		}
		return bad
	}
	return c.JSON(file)
}

// maxPurpose bounds the purpose field read.
const maxPurpose = 256

func checkPurpose(purpose string) error {
	if purpose != "batch" {
		return schemas.ErrInvalidValue.At("purpose", "purpose", "only 'batch' is supported")
	}
	return nil
}

// bodyReader is the request body, remembering whether it was read to its
// end.
type bodyReader struct {
	r     io.Reader
	eof   bool
	whole bool // in memory already: nothing left on the connection
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

// errUploadBudget: more than multipartSlack of the body outside the file.
var errUploadBudget = errors.New("multipart body has too much outside its file part")

// budgetReader bounds what the multipart reader may read beyond the file
// part's bytes: left grows by every byte of the file handed on, so part
// headers, fields and other parts together stay within multipartSlack
// (the multipart reader would otherwise take up to 10 MiB of headers).
type budgetReader struct {
	r    io.Reader
	left int64
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errUploadBudget
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// partReader is the file part as the store reads it: each byte handed on
// raises the budget, and a body that fails (cut short, malformed) is the
// client's 400, not the store's.
type partReader struct {
	p      *multipart.Part
	budget *budgetReader
}

func (r *partReader) Read(p []byte) (int, error) {
	n, err := r.p.Read(p)
	r.budget.left += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, uploadReadError(err)
	}
	return n, err
}

// uploadReadError is a body that could not be read as multipart.
func uploadReadError(err error) error {
	if errors.Is(err, errUploadBudget) {
		return schemas.ErrBadUpload.New("The multipart body has more than 64 KiB outside its file part.")
	}
	return schemas.ErrBadUpload.New("The multipart/form-data body could not be read to its end.")
}
