package registry

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/schemas"
)

// Errors of the registry. Every error a Store method returns for one of these
// reasons matches its sentinel with errors.Is and carries the OpenAI error it
// becomes, so schemas.AsError maps it without knowing this package.
var (
	ErrNotFound    = errors.New("not registered")           // 404
	ErrConflict    = errors.New("conflict")                 // 409
	ErrInvalid     = errors.New("invalid")                  // 400
	ErrUnavailable = errors.New("control-plane store down") // 503: Redis cannot be reached
)

// regError is a registry failure: its sentinel, the API error it maps to and
// the cause, all reachable with errors.Is and errors.As.
type regError struct {
	sentinel error
	api      *schemas.Error
	cause    error
}

func (e *regError) Error() string {
	if e.cause != nil {
		return e.api.Body.Message + ": " + e.cause.Error()
	}
	return e.api.Body.Message
}

func (e *regError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.sentinel, e.api, e.cause}
	}
	return []error{e.sentinel, e.api}
}

func modelNotFound(name string) error {
	return &regError{sentinel: ErrNotFound, api: schemas.ErrModelNotFound.New(name)}
}

func keyNotFound(id string) error {
	return &regError{sentinel: ErrNotFound, api: schemas.ErrKeyNotFound.New(id)}
}

func conflict(format string, args ...any) error {
	return &regError{sentinel: ErrConflict, api: schemas.ErrConflict.New(fmt.Sprintf(format, args...))}
}

func invalid(e *schemas.Error) error {
	return &regError{sentinel: ErrInvalid, api: e}
}

// storeErr classifies an error from Redis: nil stays nil, registry errors and
// the caller's own cancellation pass through, and anything that says Redis
// cannot be reached or cannot serve (refused or lost connections, timeouts,
// a loading or read-only server) becomes ErrUnavailable, a 503.
func storeErr(err error) error {
	var re *regError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &re), errors.Is(err, context.Canceled):
		return err
	case isServerError(err):
		return err // a real error reply (a bug, e.g. WRONGTYPE): a 500 through AsError
	}
	return &regError{sentinel: ErrUnavailable, cause: err,
		api: schemas.ErrStoreUnavailable.New()}
}

// isServerError reports an error reply from a Redis that is up and serving.
func isServerError(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"} {
		if redis.HasErrorPrefix(err, p) {
			return false
		}
	}
	return true
}
