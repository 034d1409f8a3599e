package gateway

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// errClientGone is the cause of a request context cancelled because the
// client hung up; 499 is for logs and metrics only (nobody reads it).
var errClientGone = schemas.ErrClientGone.New()

// errorHandler is Fiber's ErrorHandler: every error a handler returns, and
// the ones fasthttp raises before a handler runs (body too large, read
// timeout, malformed request), leave as OpenAI's nested error body.
func (g *Gateway) errorHandler(c *fiber.Ctx, err error) error {
	e := APIError(c, err, g.cfg.BodyLimit)
	if c.Locals(localID) == nil {
		// Raised by fasthttp before any handler ran (body too large, read
		// timeout, malformed HTTP): observe did not see this request.
		if e.Status == http.StatusRequestEntityTooLarge {
			drainBody(c.Context().Conn(), c.Request().Header.ContentLength())
		}
		id := g.requestID(c.Get(fiber.HeaderXRequestID))
		c.Set(fiber.HeaderXRequestID, id)
		if g.cor != nil && c.Get(fiber.HeaderOrigin) != "" {
			g.cor.setSimple(c, c.Get(fiber.HeaderOrigin)) // a page should read the 413, not a CORS failure
		}
		g.m.requests.WithLabelValues(routeUnmatched, "", strconv.Itoa(e.Status)).Inc()
		// The method only when fasthttp parsed the headers (413 comes after
		// them); after a parse error its header holds defaults (GET). Never
		// err's text: fasthttp quotes the raw request in it.
		method := "-"
		if e.Status == http.StatusRequestEntityTooLarge {
			method = LogMethod(c.Method())
		}
		g.logRequest(id, routeUnmatched, "", e.Status, 0, method, outcomeOf(e), "")
	}
	return g.writeError(c, e)
}

// APIError is the one mapping of an HTTP handler's error to its OpenAI
// error body, for the gateway and the admin API: Fiber's and fasthttp's
// own errors (no route, wrong method, body over bodyLimit, read timeout,
// malformed HTTP) by their status, everything else through
// schemas.AsError, where bus and Go errors become OpenAI errors.
func APIError(c *fiber.Ctx, err error, bodyLimit int) *schemas.Error {
	var fe *fiber.Error
	if !errors.As(err, &fe) {
		return schemas.AsError(err)
	}
	switch fe.Code {
	case http.StatusNotFound:
		// The path without the query string (where clients put api_key=...);
		// the writer redacts what looks like a secret in the path.
		return schemas.ErrUnknownURL.New(LogMethod(c.Method()), c.Path())
	case http.StatusMethodNotAllowed:
		return schemas.ErrMethodNotAllowed.New(LogMethod(c.Method()), c.Path())
	case http.StatusRequestEntityTooLarge:
		return schemas.ErrTooLarge.New(bodyLimit)
	case http.StatusRequestTimeout:
		return schemas.ErrReadTimeout.New()
	case http.StatusRequestHeaderFieldsTooLarge:
		return schemas.ErrHeadersTooLarge.New()
	}
	if fe.Code >= 500 {
		return schemas.ErrInternal.New(http.StatusText(fe.Code))
	}
	// fasthttp's message quotes the raw request, headers and all: only a
	// fixed reason leaves.
	return schemas.ErrBadHTTP.New(badHTTPReason(fe.Message))
}

// badHTTPReason is a fixed description of a fasthttp parse error, chosen by
// what its message is about; never any of the message's own text.
func badHTTPReason(msg string) string {
	// fasthttp appends the raw request after "Buffer size=": client text
	// that must not steer the choice either.
	msg, _, _ = strings.Cut(msg, "Buffer size=")
	switch m := strings.ToLower(msg); {
	case strings.Contains(m, "content-length"):
		return "invalid Content-Length"
	case strings.Contains(m, "chunk"):
		return "invalid chunked body"
	case strings.Contains(m, "first line"), strings.Contains(m, "request uri"), strings.Contains(m, "method"):
		return "invalid request line"
	case strings.Contains(m, "header"):
		return "invalid header"
	}
	return "unreadable request"
}

// Bounds of drainBody.
const (
	drainMax  = 64 << 20
	drainTime = 2 * time.Second
	drainIdle = 100 * time.Millisecond
)

// drainBody reads and discards the rest of a request body that fasthttp
// refused (413) without reading, before the response is written. fasthttp
// closes the connection after it; closing with unread data in the socket
// makes the kernel send a reset, and a client still sending its body then
// gets "connection reset" instead of the 413 (and OpenAI SDKs retry
// connection errors). Bounded in bytes and time; a chunked body (length
// unknown) is drained until the client pauses.
func drainBody(conn net.Conn, contentLength int) {
	if conn == nil {
		return
	}
	limit := int64(contentLength)
	if limit < 0 || limit > drainMax {
		limit = drainMax
	}
	end := time.Now().Add(drainTime)
	buf := make([]byte, 32<<10)
	for limit > 0 {
		dl := time.Now().Add(drainIdle)
		if dl.After(end) {
			dl = end
		}
		if conn.SetReadDeadline(dl) != nil {
			return
		}
		n, err := conn.Read(buf)
		limit -= int64(n)
		if err != nil {
			return
		}
	}
}

// writeError writes e as the whole response, redacted.
func (g *Gateway) writeError(c *fiber.Ctx, e *schemas.Error) error {
	return WriteError(c, g.cfg.Redactor.Error(e))
}

// WriteError writes e as the whole response: OpenAI's body, Retry-After
// when e has one. Callers redact e first (Redactor.Error).
func WriteError(c *fiber.Ctx, e *schemas.Error) error {
	if e.RetryAfter > 0 {
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(e.RetryAfter))
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(e.Status).Send(e.JSON())
}
