package schemas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Error is an OpenAI-shaped error together with its HTTP status. It is the one
// error type that crosses the bus (payload of an error frame) and the one the
// gateway writes; AsError maps every other error to it, in one place.
type Error struct {
	Status     int       `json:"status"`
	RetryAfter int       `json:"retry_after,omitempty"` // seconds; sent as Retry-After
	Body       ErrorBody `json:"error"`
}

// ErrorBody is OpenAI's nested error object; all four keys are always present.
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Body.Type, e.Body.Message)
}

// WithRetryAfter sets the Retry-After hint, in seconds, and returns e.
func (e *Error) WithRetryAfter(seconds int) *Error {
	e.RetryAfter = seconds
	return e
}

// JSON is the body OpenAI clients expect: {"error":{...}}.
func (e *Error) JSON() []byte {
	b, _ := json.Marshal(struct {
		Error ErrorBody `json:"error"`
	}{e.Body})
	return b
}

// Error types as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeOverloaded     = "overloaded_error"
	TypeServer         = "server_error"
	TypeTimeout        = "timeout_error"
)

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// newError builds an Error; empty param or code become JSON null. Only the
// catalogue (catalog.go) calls it: every other error is made from a
// definition there.
func newError(status int, typ, code, param, msg string) *Error {
	return &Error{Status: status, Body: ErrorBody{Message: msg, Type: typ, Param: strp(param), Code: strp(code)}}
}

// Codes that clients and tests can rely on (the catalogue has them all).
const (
	CodeQueueFull         = "queue_full"
	CodeNoWorker          = "no_worker"
	CodeNoDispatcher      = "no_dispatcher"
	CodeBusUnavailable    = "bus_unavailable" // the NATS connection is down
	CodeStreamLost        = "stream_lost"     // gap in the sequence or worker went silent
	CodeWorkerBusy        = "worker_busy"     // a worker at its cap, with no dispatcher to hand it back to
	CodeShuttingDown      = "shutting_down"   // the serving process is draining
	CodeEngineError       = "engine_error"
	CodeEngineTruncated   = "engine_stream_truncated" // a stream ended before any finish_reason
	CodeEngineUnhealthy   = "engine_unhealthy"
	CodeAdapterLoadFailed = "adapter_load_failed"
)

// AsError maps any error to an *Error. This is the only place where Go errors
// become OpenAI error bodies.
func AsError(err error) *Error {
	var e *Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return e
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimedOut.New()
	case errors.Is(err, context.Canceled):
		// The client went away; the status is for logs and metrics only.
		return ErrClientGone.New()
	}
	return ErrInternal.New(err.Error())
}

// ParseErrorPayload decodes an error frame payload; a malformed one becomes a 502.
func ParseErrorPayload(b []byte) *Error {
	var e Error
	if err := json.Unmarshal(b, &e); err != nil || e.Status < 400 || e.Status > 599 {
		return ErrBadErrorFrame.New()
	}
	if e.Body.Type == "" {
		e.Body.Type = TypeServer
	}
	return &e
}

// Payload is e as an error frame payload.
func (e *Error) Payload() []byte {
	b, _ := json.Marshal(e)
	return b
}
