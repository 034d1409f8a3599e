package simserver

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/tokenbus/tokenbus/schemas"
)

// vLLM's error types (err_type) by status; other statuses get the HTTP
// reason phrase, as vLLM's HTTPException handler does.
func errType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusInternalServerError:
		return "InternalServerError"
	}
	return http.StatusText(status)
}

// vllmError is one error as vLLM sends it.
type vllmError struct {
	status     int
	typ        string
	message    string
	param      *string
	retryAfter int
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type legacyError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// fromError maps an engine error to vLLM's: a *schemas.Error keeps its
// status, message and param; anything else is a 500.
func fromError(err error) vllmError {
	var se *schemas.Error
	if !errors.As(err, &se) {
		se = schemas.ErrInternal.New(err.Error())
	}
	return vllmError{status: se.Status, typ: errType(se.Status), message: se.Body.Message, param: se.Body.Param, retryAfter: se.RetryAfter}
}

func newError(status int, typ, msg string) vllmError {
	if typ == "" {
		typ = errType(status)
	}
	return vllmError{status: status, typ: typ, message: msg}
}

// body is the error object: nested (vLLM ≥ 0.10.1) or flat (legacy).
func (e vllmError) body(legacy bool) []byte {
	var v any = struct {
		Error errorInfo `json:"error"`
	}{errorInfo{e.message, e.typ, e.param, e.status}}
	if legacy {
		v = legacyError{"error", e.message, e.typ, e.param, e.status}
	}
	b, _ := json.Marshal(v)
	return b
}

func (s *Server) writeError(w http.ResponseWriter, e vllmError) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeRaw(w, e.status, "application/json", e.body(s.cfg.LegacyErrors))
}

func writeRaw(w http.ResponseWriter, status int, contentType string, b []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{}`)
	}
	writeRaw(w, status, "application/json", b)
}
