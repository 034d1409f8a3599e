package httpengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tokenbus/tokenbus/schemas"
)

// UpstreamError turns a server's error answer into OpenAI's nested error
// with status. It reads every shape seen in the wild:
//
//	{"error":{"message","type","param","code"}}          OpenAI, vLLM >= 0.10.1 (code an int there)
//	{"object":"error","message","type","param","code"}   vLLM before 0.10.1
//	{"error":"message","error_type":"..."}                TGI
//	{"detail":"message"}                                 FastAPI
//	{"detail":[{"loc":[...],"msg":...}]}                 FastAPI validation (a 422): a 400 naming the field
//	anything else                                        the text itself
//
// A 500 whose body is not an error object (a plain-text or HTML page, a
// traceback) is a 502 engine_error with that text: the engine failed, not
// tokenbus.
//
// A string code is kept; a numeric one is the HTTP status again and becomes
// null (it sets the status when status is 0, as for a mid-stream error
// object, which otherwise is a 502). A type that is not OpenAI's (vLLM says
// "BadRequestError") is replaced by OpenAI's type for the status.
func UpstreamError(status int, body []byte) *schemas.Error {
	var msg, typ string
	var param, code *string
	var numCode int
	isObject := false

	var top struct {
		Error     json.RawMessage `json:"error"`
		ErrorType string          `json:"error_type"`
		Detail    json.RawMessage `json:"detail"`
		errorObject
	}
	body = bytes.TrimSpace(body)
	if json.Unmarshal(body, &top) == nil {
		isObject = true
		var o *errorObject
		switch {
		case len(top.Error) > 0 && top.Error[0] == '{':
			o = new(errorObject)
			if json.Unmarshal(top.Error, o) != nil {
				o = nil
			}
		case len(top.Error) > 0 && top.Error[0] == '"':
			_ = json.Unmarshal(top.Error, &msg)
			typ = top.ErrorType
		case top.Message != nil:
			o = &top.errorObject
		case len(top.Detail) > 0:
			var s string
			if json.Unmarshal(top.Detail, &s) == nil {
				msg = s
				if status == http.StatusUnprocessableEntity {
					// FastAPI servers refuse a request they cannot take with a
					// 422 and a sentence; OpenAI's status for that is 400.
					status = http.StatusBadRequest
					param = unexpectedField(s)
				}
			} else if m, p, ok := validationDetail(top.Detail); ok {
				msg, param = m, p
				if status == http.StatusUnprocessableEntity {
					status = http.StatusBadRequest // OpenAI's status for a bad field
				}
			} else {
				msg = string(top.Detail)
			}
		}
		if o != nil {
			if o.Message != nil {
				msg = *o.Message
			}
			typ = o.Type
			param = rawString(o.Param)
			code = rawString(o.Code)
			if code == nil {
				numCode, _ = strconv.Atoi(string(o.Code))
			}
		}
	} else if utf8.Valid(body) {
		msg = string(body)
	}
	if status == http.StatusInternalServerError && !isObject {
		msg = strings.TrimSpace("the engine answered 500 Internal Server Error: " + strings.TrimSpace(msg))
		msg = strings.TrimSuffix(msg, ":")
		status = http.StatusBadGateway
	}

	if status == 0 {
		status = http.StatusBadGateway
		if numCode >= 400 && numCode <= 599 {
			status = numCode
		}
	}
	if status < 400 || status > 599 {
		status = http.StatusBadGateway
	}
	if msg = strings.TrimSpace(msg); msg == "" {
		msg = "the engine answered " + strconv.Itoa(status) + " " + http.StatusText(status)
	}
	if len(msg) > 2000 {
		msg = msg[:2000] + "..."
	}
	if !isOpenAIType(typ) {
		typ = typeFor(status)
	}
	c := ""
	if code != nil {
		c = *code
	} else if status == http.StatusBadGateway {
		c = schemas.CodeEngineError
	}
	p := ""
	if param != nil {
		p = *param
	}
	return schemas.FromUpstream(status, typ, c, p, msg)
}

// unexpectedField is the first field named by transformers serve's refusal
// of fields it does not know, "Unexpected fields in the request:
// {'ignore_eos', 'x'}"; nil for any other sentence.
func unexpectedField(s string) *string {
	_, set, ok := strings.Cut(s, "Unexpected fields in the request: {'")
	if !ok {
		return nil
	}
	f, _, ok := strings.Cut(set, "'")
	if !ok || f == "" {
		return nil
	}
	return &f
}

// validationDetail reads FastAPI's validation list,
// [{"loc":["body","ignore_eos"],"msg":"Extra inputs are not permitted",...}],
// as "ignore_eos: Extra inputs are not permitted" (several joined by "; ")
// and the first field's path as param ("messages[0].content").
func validationDetail(d json.RawMessage) (msg string, param *string, ok bool) {
	var items []struct {
		Loc []json.RawMessage `json:"loc"`
		Msg string            `json:"msg"`
	}
	if json.Unmarshal(d, &items) != nil || len(items) == 0 {
		return "", nil, false
	}
	var parts []string
	for _, it := range items {
		if it.Msg == "" {
			return "", nil, false // not the validation shape
		}
		field := fieldPath(it.Loc)
		if param == nil && field != "" {
			param = &field
		}
		if field != "" {
			parts = append(parts, field+": "+it.Msg)
		} else {
			parts = append(parts, it.Msg)
		}
	}
	return strings.Join(parts, "; "), param, true
}

// fieldPath is a FastAPI loc as a field path: the leading "body" (or
// "query"...) dropped, strings joined by '.', numbers as [i].
func fieldPath(loc []json.RawMessage) string {
	var b strings.Builder
	for i, l := range loc {
		var s string
		if json.Unmarshal(l, &s) == nil {
			if i == 0 && (s == "body" || s == "query" || s == "path" || s == "header") {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s)
			continue
		}
		var n int
		if json.Unmarshal(l, &n) == nil {
			fmt.Fprintf(&b, "[%d]", n)
		}
	}
	return b.String()
}

// answerError is the error for a non-2xx answer of the engine to method
// path: UpstreamError, and for an empty body (some servers give no reason)
// a message naming the status and the endpoint, so that the cause can be
// looked for.
func answerError(status int, body []byte, method, path string) *schemas.Error {
	se := UpstreamError(status, body)
	if len(bytes.TrimSpace(body)) == 0 {
		se.Body.Message = fmt.Sprintf("the engine answered %d %s with an empty body to %s %s", status, http.StatusText(status), method, path)
	}
	return se
}

type errorObject struct {
	Message *string         `json:"message"`
	Type    string          `json:"type"`
	Param   json.RawMessage `json:"param"`
	Code    json.RawMessage `json:"code"`
}

// rawString is a JSON string's value; nil for null, numbers and the rest.
func rawString(r json.RawMessage) *string {
	var s string
	if len(r) == 0 || r[0] != '"' || json.Unmarshal(r, &s) != nil || s == "" {
		return nil
	}
	return &s
}

func isOpenAIType(t string) bool {
	switch t {
	case schemas.TypeInvalidRequest, schemas.TypeAuthentication, schemas.TypePermission, schemas.TypeNotFound,
		schemas.TypeRateLimit, schemas.TypeOverloaded, schemas.TypeServer, schemas.TypeTimeout:
		return true
	}
	return false
}

// typeFor is OpenAI's error type for a status.
func typeFor(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return schemas.TypeAuthentication
	case http.StatusForbidden:
		return schemas.TypePermission
	case http.StatusTooManyRequests:
		return schemas.TypeRateLimit
	case http.StatusServiceUnavailable:
		return schemas.TypeOverloaded
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		return schemas.TypeTimeout
	}
	if status < 500 {
		return schemas.TypeInvalidRequest
	}
	return schemas.TypeServer
}

// retryAfter is a Retry-After header in seconds (0 if absent or a date).
func retryAfter(h http.Header) int {
	n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// scrubKey removes key (the engine's API key, which tokenbus sends as
// Authorization) from an upstream error's message and param: a server or a
// proxy in front of it may quote the request's headers, and the message
// travels to the client and into logs.
func scrubKey(se *schemas.Error, key string) *schemas.Error {
	if key == "" || se == nil {
		return se
	}
	se.Body.Message = strings.ReplaceAll(se.Body.Message, key, "***")
	if se.Body.Param != nil && strings.Contains(*se.Body.Param, key) {
		p := strings.ReplaceAll(*se.Body.Param, key, "***")
		se.Body.Param = &p
	}
	return se
}

// Redact is se without the engine's API key (see scrubKey), for errors made
// from what the engine answered to Call.
func (e *Engine) Redact(se *schemas.Error) *schemas.Error { return scrubKey(se, e.cfg.APIKey) }

// noRoute reports whether a 404's body is a server's "no such route" (an
// empty body, FastAPI's {"detail":"Not Found"}, a plain "Not Found" or
// "404 page not found"), not an error about the request (vLLM's "The model
// `x` does not exist.").
func noRoute(body []byte) bool {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return true
	}
	var d struct {
		Detail *string `json:"detail"`
	}
	if json.Unmarshal(body, &d) == nil && d.Detail != nil {
		return strings.EqualFold(*d.Detail, "Not Found")
	}
	s := strings.ToLower(string(body))
	return s == "not found" || s == "404 page not found" || s == "404 not found"
}
