package httpengine

import (
	"bytes"
	"encoding/json"
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
//	{"detail":"message"} or {"detail":[{...}]}           FastAPI
//	anything else                                        the text itself
//
// A string code is kept; a numeric one is the HTTP status again and becomes
// null (it sets the status when status is 0, as for a mid-stream error
// object, which otherwise is a 502). A type that is not OpenAI's (vLLM says
// "BadRequestError") is replaced by OpenAI's type for the status.
func UpstreamError(status int, body []byte) *schemas.Error {
	var msg, typ string
	var param, code *string
	var numCode int

	var top struct {
		Error     json.RawMessage `json:"error"`
		ErrorType string          `json:"error_type"`
		Detail    json.RawMessage `json:"detail"`
		errorObject
	}
	body = bytes.TrimSpace(body)
	if json.Unmarshal(body, &top) == nil {
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
