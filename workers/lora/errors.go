package lora

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

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
	from := ""
	if path != "" {
		from = fmt.Sprintf(" from `%s`", path)
	}
	why := strings.TrimSuffix(cause.Body.Message, ".")
	if cause.Status >= 400 && cause.Status < 500 && cause.Status != http.StatusRequestTimeout &&
		cause.Status != http.StatusTooManyRequests && cause.Status != 499 {
		return schemas.ErrAdapterLoadFailed.New(name, from, m.cfg.Worker, why)
	}
	return schemas.ErrAdapterLoadUnavailable.New(name, from, m.cfg.Worker, why)
}
