package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/internal/jsonscan"
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

// The fields the gateway reads, by their exact top-level key.
const (
	fModel = iota
	fStream
	fStreamOptions
	fN
	fPriority
	fMessages
	fPrompt
	numFields
)

var fieldNames = [numFields]string{"model", "stream", "stream_options", "n", "priority", "messages", "prompt"}

func fieldIndex(key []byte) int {
	switch string(key) { // no allocation
	case "model":
		return fModel
	case "stream":
		return fStream
	case "stream_options":
		return fStreamOptions
	case "n":
		return fN
	case "priority":
		return fPriority
	case "messages":
		return fMessages
	case "prompt":
		return fPrompt
	}
	return -1
}

// parseRequest validates body for kind. pathModel is the TorchServe path's
// model ("" on /v1 routes): the default when the body names none.
//
// Keys are matched exactly and the fields the gateway reads must not repeat:
// encoding/json alone matches keys case-insensitively and keeps the last of
// duplicates, while the Python engines behind the bus match exactly and may
// keep the first, so {"model":"a","Model":"b"} would be routed (and, later,
// authorised) as one model and run as another. The values themselves are
// decoded with encoding/json; messages and prompt are only checked for their
// JSON type, never copied.
func parseRequest(kind schemas.Kind, body []byte, pathModel string) (*apiRequest, *schemas.Error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, schemas.BadRequest("", "The request body is empty; expected a JSON object.")
	}
	if !json.Valid(body) {
		var v struct{}
		return nil, jsonError(json.Unmarshal(body, &v)) // for the error's position
	}
	if body[0] != '{' {
		return nil, schemas.BadRequest("", "The request body must be a JSON object.")
	}
	var raw [numFields][]byte
	var dup *schemas.Error
	eachMember(body, func(key, val []byte) {
		i := fieldIndex(key)
		if i < 0 || dup != nil {
			return
		}
		if raw[i] != nil {
			dup = schemas.BadRequest(fieldNames[i], "Duplicate key '%s' in the request body.", fieldNames[i])
		}
		raw[i] = val
	})
	if dup != nil {
		return nil, dup
	}

	r := &apiRequest{N: 1}
	streamOptions := false
	switch m := raw[fModel]; {
	case m == nil && pathModel != "":
		r.Model, r.modelFromPath = pathModel, true
	case m == nil || m[0] == 'n':
		return nil, schemas.BadRequest("model", "You must provide a model parameter.")
	case m[0] != '"':
		return nil, typeError("model", "a string", m)
	case len(m) == 2: // ""
		return nil, schemas.BadRequest("model", "You must provide a model parameter.")
	case bytes.IndexByte(m, '\\') < 0: // no escapes (the body is valid JSON): the bytes are the string
		r.Model = string(m[1 : len(m)-1])
	default:
		if err := json.Unmarshal(m, &r.Model); err != nil {
			return nil, jsonError(err)
		}
		if r.Model == "" {
			return nil, schemas.BadRequest("model", "You must provide a model parameter.")
		}
	}

	if v := raw[fStream]; v != nil && v[0] != 'n' {
		if v[0] != 't' && v[0] != 'f' {
			return nil, typeError("stream", "a boolean", v)
		}
		r.Stream = v[0] == 't'
	}
	if v := raw[fStreamOptions]; v != nil && v[0] != 'n' {
		if v[0] != '{' {
			return nil, typeError("stream_options", "an object", v)
		}
		// Only include_usage matters (keys fold case, the last one wins, as
		// encoding/json reads them); anything but a boolean or null takes
		// encoding/json's path for its error.
		var inc []byte
		jsonscan.Members(v, func(k, val []byte) bool {
			if bytes.EqualFold(jsonscan.Key(k), []byte("include_usage")) {
				inc = val
			}
			return true
		})
		switch string(inc) {
		case "", "null", "true", "false":
		default:
			var so struct {
				IncludeUsage *bool `json:"include_usage"`
			}
			if err := json.Unmarshal(v, &so); err != nil {
				return nil, jsonErrorIn("stream_options", err)
			}
		}
		streamOptions = true
		// vLLM turns usage on for stream_options:{}; OpenAI needs include_usage:true.
		r.IncludeUsage = string(inc) != "false"
	}
	if v := raw[fN]; v != nil && v[0] != 'n' {
		if err := json.Unmarshal(v, &r.N); err != nil {
			return nil, typeError("n", "an integer", v)
		}
	}
	if v := raw[fPriority]; v != nil && v[0] != 'n' {
		if err := json.Unmarshal(v, &r.Priority); err != nil {
			return nil, typeError("priority", "an integer", v)
		}
	}

	// Types are right; now what is missing or out of range.
	switch kind {
	case schemas.KindChat:
		switch m := raw[fMessages]; {
		case m == nil || m[0] == 'n':
			return nil, schemas.BadRequest("messages", "Missing required parameter: 'messages'.")
		case m[0] != '[':
			return nil, typeError("messages", "an array of objects", m)
		case isEmptyArray(m):
			return nil, schemas.BadRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
		}
	case schemas.KindCompletion:
		switch p := raw[fPrompt]; {
		case p == nil || p[0] == 'n':
			return nil, schemas.BadRequest("prompt", "Missing required parameter: 'prompt'.")
		case p[0] != '"' && p[0] != '[':
			return nil, typeError("prompt", "a string or an array", p)
		case isEmptyArray(p):
			return nil, schemas.BadRequest("prompt", "Invalid 'prompt': empty array. Expected at least one prompt.")
		}
	}

	if streamOptions && !r.Stream {
		return nil, schemas.BadRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	if r.N < 1 {
		return nil, schemas.BadRequest("n", "Invalid 'n': integer below minimum value. Expected a value >= 1, but got %d instead.", r.N)
	}
	return r, nil
}

// eachMember calls fn with the key (escapes decoded) and raw value of every
// top-level member of obj, which must be valid JSON.
func eachMember(obj []byte, fn func(key, val []byte)) {
	jsonscan.Members(obj, func(key, val []byte) bool {
		fn(jsonscan.Key(key), val)
		return true
	})
}

func typeError(param, want string, v []byte) *schemas.Error {
	return schemas.BadRequest(param, "Invalid type for '%s': expected %s, but got %s instead.", param, want, jsonKind(v[0]))
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

// jsonErrorIn is jsonError for a value decoded on its own at param.
func jsonErrorIn(param string, err error) *schemas.Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		te.Field = strings.TrimSuffix(param+"."+te.Field, ".")
	}
	return jsonError(err)
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

var (
	errUnsupportedMediaType = schemas.NewError(http.StatusUnsupportedMediaType, schemas.TypeInvalidRequest,
		"unsupported_media_type", "", "Unsupported Content-Type: expected application/json.")
	errContentEncoding = schemas.NewError(http.StatusUnsupportedMediaType, schemas.TypeInvalidRequest,
		"unsupported_media_type", "", "Compressed request bodies are not supported: send the JSON body without Content-Encoding.")
)

// requestID returns the client's X-Request-Id when it is acceptable, else a
// fresh one.
func requestID(given string) string {
	if schemas.ValidRequestID(given) {
		return strings.Clone(given)
	}
	return "req-" + nuid.Next()
}
