package gateway

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// A request body is read once, by schemas.ReadRequest, the reader every
// process of tokenbus uses; the gateway acts on its view (model, stream, n,
// priority...) and publishes the body itself, byte for byte.

// payload is the body to publish: a copy of the body (fasthttp reuses its
// buffers), with "model" inserted when it came from the TorchServe path.
func payload(r *schemas.Request) []byte {
	body := r.Body
	if !r.ModelDefaulted {
		return bytes.Clone(body)
	}
	i := bytes.IndexByte(body, '{') // ReadRequest checked it is an object
	model, _ := json.Marshal(r.Model)
	out := make([]byte, 0, len(body)+len(model)+10)
	out = append(out, body[:i+1]...)
	out = append(out, `"model":`...)
	out = append(out, model...)
	rest := body[i+1:]
	if t := bytes.TrimSpace(rest); len(t) > 0 && t[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// isJSON reports whether a Content-Type is application/json, parameters
// allowed (and not judged, like vLLM).
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

var (
	errUnsupportedMediaType = schemas.ErrUnsupportedMediaType.New()
	errContentEncoding      = schemas.ErrContentEncoding.New()
)

// requestID returns the client's X-Request-Id when it is acceptable, else a
// fresh one. An id that holds a secret (a key pasted in the wrong header) is
// not: the id is echoed, logged and sent on the bus.
func (g *Gateway) requestID(given string) string {
	if schemas.ValidRequestID(given) && g.cfg.Redactor.String(given) == given {
		return strings.Clone(given)
	}
	return "req-" + nuid.Next()
}
