package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// apiRequest is what the gateway reads from a completion request body; the
// body itself travels on unchanged.
type apiRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	N            int
	Priority     int
	// modelFromPath: the body had no "model" and the TorchServe path's model
	// was used; payload inserts it into the body.
	modelFromPath bool
}

// wireRequest is the subset of an OpenAI request body the gateway decodes.
// Raw fields are checked by hand so that absent, null and wrong types can be
// told apart; typed pointers let encoding/json name the field of a type error.
type wireRequest struct {
	Model         json.RawMessage `json:"model"`
	Stream        *bool           `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	N        *int  `json:"n"`
	Priority *int  `json:"priority"`
	Messages shape `json:"messages"`
	Prompt   shape `json:"prompt"`
}

// shape records the JSON type of a value without keeping a copy of it (the
// messages or prompt of a request can be megabytes).
type shape struct {
	kind  byte // first byte of the value; 0: absent
	empty bool // an empty array
}

func (s *shape) UnmarshalJSON(b []byte) error {
	s.kind = b[0]
	s.empty = isEmptyArray(b)
	return nil
}

// absent reports a missing or null value.
func (s shape) absent() bool { return s.kind == 0 || s.kind == 'n' }

// parseRequest validates body for kind. pathModel is the TorchServe path's
// model ("" on /v1 routes): the default when the body names none.
func parseRequest(kind schemas.Kind, body []byte, pathModel string) (*apiRequest, *schemas.Error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, schemas.BadRequest("", "The request body is empty; expected a JSON object.")
	}
	if body[0] != '{' {
		return nil, schemas.BadRequest("", "The request body must be a JSON object.")
	}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, jsonError(err)
	}
	r := &apiRequest{N: 1, Stream: w.Stream != nil && *w.Stream}

	switch m := w.Model; {
	case m == nil && pathModel != "":
		r.Model, r.modelFromPath = pathModel, true
	case m == nil || string(m) == "null":
		return nil, schemas.BadRequest("model", "You must provide a model parameter.")
	case m[0] != '"':
		return nil, schemas.BadRequest("model", "Invalid type for 'model': expected a string, but got %s instead.", jsonKind(m[0]))
	default:
		if err := json.Unmarshal(m, &r.Model); err != nil {
			return nil, jsonError(err)
		}
		if r.Model == "" {
			return nil, schemas.BadRequest("model", "You must provide a model parameter.")
		}
	}

	switch kind {
	case schemas.KindChat:
		switch m := w.Messages; {
		case m.absent():
			return nil, schemas.BadRequest("messages", "Missing required parameter: 'messages'.")
		case m.kind != '[':
			return nil, schemas.BadRequest("messages", "Invalid type for 'messages': expected an array of objects, but got %s instead.", jsonKind(m.kind))
		case m.empty:
			return nil, schemas.BadRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
		}
	case schemas.KindCompletion:
		switch p := w.Prompt; {
		case p.absent():
			return nil, schemas.BadRequest("prompt", "Missing required parameter: 'prompt'.")
		case p.kind != '"' && p.kind != '[':
			return nil, schemas.BadRequest("prompt", "Invalid type for 'prompt': expected a string or an array, but got %s instead.", jsonKind(p.kind))
		case p.empty:
			return nil, schemas.BadRequest("prompt", "Invalid 'prompt': empty array. Expected at least one prompt.")
		}
	}

	if w.StreamOptions != nil {
		if !r.Stream {
			return nil, schemas.BadRequest("stream_options", "Stream options can only be defined when `stream=True`.")
		}
		// vLLM turns usage on for stream_options:{}; OpenAI needs include_usage:true.
		r.IncludeUsage = w.StreamOptions.IncludeUsage == nil || *w.StreamOptions.IncludeUsage
	}
	if w.N != nil {
		if *w.N < 1 {
			return nil, schemas.BadRequest("n", "Invalid 'n': integer below minimum value. Expected a value >= 1, but got %d instead.", *w.N)
		}
		r.N = *w.N
	}
	if w.Priority != nil {
		r.Priority = *w.Priority
	}
	return r, nil
}

// payload is the body to publish: a copy of body (fasthttp reuses its
// buffers), with "model" inserted when it came from the TorchServe path.
func (r *apiRequest) payload(body []byte) []byte {
	if !r.modelFromPath {
		return bytes.Clone(body)
	}
	i := bytes.IndexByte(body, '{') // parseRequest checked it is an object
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

func isEmptyArray(raw []byte) bool {
	return len(raw) >= 2 && raw[0] == '[' && len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
}

// jsonKind names the JSON type of a value by its first byte, for error messages.
func jsonKind(first byte) string {
	switch first {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// jsonError turns an encoding/json error into a 400 that names the parameter
// when there is one.
func jsonError(err error) *schemas.Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return schemas.BadRequest("", "The request body must be a JSON object.")
		}
		return schemas.BadRequest(te.Field, "Invalid type for '%s': expected %s, but got %s instead.",
			te.Field, goKind(te.Type), articled(te.Value))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return schemas.BadRequest("", "We could not parse the JSON body of your request (%v at byte %d). "+
			"The API expects a JSON payload.", se, se.Offset)
	}
	return schemas.BadRequest("", "We could not parse the JSON body of your request: %v", err)
}

func goKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return t.String()
}

// articled turns encoding/json's value kind ("string", "number 1.5") into prose.
func articled(v string) string {
	switch {
	case v == "":
		return "another type"
	case strings.HasPrefix(v, "array"), strings.HasPrefix(v, "object"):
		return "an " + v
	case v == "null":
		return v
	}
	return "a " + v
}

// isJSON reports whether a Content-Type is application/json, parameters
// allowed (and not judged, like vLLM).
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

var errUnsupportedMediaType = schemas.NewError(http.StatusUnsupportedMediaType, schemas.TypeInvalidRequest,
	"unsupported_media_type", "", "Unsupported Content-Type: expected application/json.")

// requestID returns the client's X-Request-Id when it is acceptable, else a
// fresh one.
func requestID(given string) string {
	if schemas.ValidRequestID(given) {
		return strings.Clone(given)
	}
	return "req-" + nuid.Next()
}
