package gateway

import (
	"bytes"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/schemas"
)

// Request smuggling: a proxy in front of the gateway and fasthttp must agree
// on where a request's body ends. fasthttp is lenient where they may not:
// of two Content-Length headers it takes the last, any Transfer-Encoding
// but identity means chunked, Transfer-Encoding beats Content-Length, and
// an obs-folded line or a bare CR is read as part of a value. Such a request
// is refused (400) and its connection closed, so no bytes after it are read
// as a next request.
//
// fasthttp reads the body before any handler runs, so the check is in two
// parts on the same raw headers: FramingHook (fasthttp's HeaderReceived,
// after the headers, before the body) stops the body from being read and
// marks the connection to close; CheckFraming (a middleware) answers the
// 400. An ambiguous request is never served.

// maxContentLengthDigits keeps a Content-Length well inside int64.
const maxContentLengthDigits = 18

// FramingHook is fasthttp.Server.HeaderReceived: for a request with
// ambiguous framing it sets Content-Length 0 (so fasthttp reads no body)
// and Connection: close. Install it with GuardFraming.
func FramingHook(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if framingProblem(h) != "" {
		h.SetContentLength(0)
		h.SetConnectionClose()
	}
	return fasthttp.RequestConfig{}
}

// CheckFraming is the middleware that refuses what FramingHook marked. It
// re-reads the headers only for a request that asked for Connection: close
// (FramingHook sets it), so keep-alive requests pay one flag test.
func CheckFraming(c *fiber.Ctx) error {
	h := &c.Request().Header
	if !h.ConnectionClose() {
		return c.Next()
	}
	if why := framingProblem(h); why != "" {
		c.Context().SetConnectionClose()
		return schemas.ErrBadHTTP.New(why)
	}
	return c.Next()
}

// GuardFraming installs FramingHook on app's server; the caller adds
// CheckFraming where its middleware chain should answer (first, or after
// the middleware that logs).
func GuardFraming(app *fiber.App) {
	app.Server().HeaderReceived = FramingHook
}

// framingProblem says what makes the request's framing ambiguous, "" when
// nothing does. It reads the raw header block as the client sent it, and
// the request line.
func framingProblem(h *fasthttp.RequestHeader) string {
	if bytes.IndexByte(h.RequestURI(), '\r') >= 0 || bytes.IndexByte(h.Method(), '\r') >= 0 {
		return "bare CR in the request line"
	}
	return rawFramingProblem(h.RawHeaders())
}

// rawFramingProblem checks a raw header block (lines ending in LF or CRLF,
// the empty line that ends it included or not).
func rawFramingProblem(raw []byte) string {
	var lengths, encodings int
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if len(line) == 0 {
			continue
		}
		if bytes.IndexByte(line, '\r') >= 0 {
			return "bare CR in a header"
		}
		if line[0] == ' ' || line[0] == '\t' {
			return "folded header line (obs-fold)"
		}
		name, value, _ := bytes.Cut(line, []byte{':'})
		value = bytes.Trim(value, " \t")
		switch {
		case asciiEqualFold(name, "content-length"):
			lengths++
			if lengths > 1 {
				return "repeated Content-Length"
			}
			if !digits(value) {
				return "invalid Content-Length"
			}
		case asciiEqualFold(name, "transfer-encoding"):
			encodings++
			if encodings > 1 {
				return "repeated Transfer-Encoding"
			}
			if !asciiEqualFold(value, "chunked") {
				return "Transfer-Encoding other than chunked"
			}
		}
	}
	if lengths > 0 && encodings > 0 {
		return "Transfer-Encoding with Content-Length"
	}
	return ""
}

// digits: 1 to maxContentLengthDigits ASCII digits, nothing else.
func digits(v []byte) bool {
	if len(v) == 0 || len(v) > maxContentLengthDigits {
		return false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// asciiEqualFold compares a header name or token, ASCII case-insensitively.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// RefuseUnknownMethods answers a request whose method is none of HTTP's
// standard ones with OpenAI's 400 bad_request and closes the connection:
// Fiber would answer it in plain text, before any middleware. onRefused, if
// set, is called after the answer is written (to count and log it).
func RefuseUnknownMethods(app *fiber.App, onRefused func(ctx *fasthttp.RequestCtx, e *schemas.Error)) {
	srv := app.Server()
	next := srv.Handler
	srv.Handler = func(ctx *fasthttp.RequestCtx) {
		if LogMethod(string(ctx.Method())) != "-" {
			next(ctx)
			return
		}
		e := errUnknownMethod
		ctx.SetStatusCode(e.Status)
		ctx.SetContentType(fiber.MIMEApplicationJSON)
		ctx.SetBody(e.JSON())
		ctx.SetConnectionClose()
		if onRefused != nil {
			onRefused(ctx, e)
		}
	}
}

var errUnknownMethod = schemas.ErrBadHTTP.New("unknown method")
