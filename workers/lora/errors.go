package lora

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/tokenbus/tokenbus/schemas"
)

// loadError is what a request for an adapter that cannot be loaded gets: a
// 503 to retry for an engine that is down, overloaded or slow, a 500 for a
// load the engine refused (a bad path: retrying does not help), both with
// code adapter_load_failed and the engine's message.
func (m *Manager) loadError(name, path string, err error) *schemas.Error {
	var se *schemas.Error
	if errors.As(err, &se) && se.Body.Code != nil && *se.Body.Code == schemas.CodeAdapterLoadFailed {
		return se
	}
	cause := schemas.AsError(err)
	msg := fmt.Sprintf("cannot load LoRA adapter `%s`", name)
	if path != "" {
		msg += fmt.Sprintf(" from `%s`", path)
	}
	msg += fmt.Sprintf(" on worker %s: %s", m.cfg.Worker, cause.Body.Message)
	if cause.Status >= 400 && cause.Status < 500 && cause.Status != http.StatusRequestTimeout &&
		cause.Status != http.StatusTooManyRequests && cause.Status != 499 {
		return schemas.NewError(http.StatusInternalServerError, schemas.TypeServer, schemas.CodeAdapterLoadFailed, "model", msg)
	}
	e := schemas.NewError(http.StatusServiceUnavailable, schemas.TypeOverloaded, schemas.CodeAdapterLoadFailed, "model", msg)
	e.RetryAfter = 1
	return e
}
