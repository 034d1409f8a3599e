package httpengine

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

type healthState struct {
	err   error     // nil: healthy
	since time.Time // when the current verdict began
}

// healthLoop probes HealthPath every HealthInterval and caches the verdict.
func (e *Engine) healthLoop() {
	t := time.NewTicker(e.cfg.HealthInterval)
	defer t.Stop()
	aborted := false // in-flight requests already ended for this bad spell
	for {
		err := e.probe()
		prev := e.health.Load()
		now := time.Now()
		if err == nil && e.proc != nil {
			e.proc.markHealthy()
		}
		switch {
		case err == nil && prev.err != nil:
			e.health.Store(&healthState{since: now})
			e.log.Info("engine healthy", "url", e.base)
			aborted = false
			e.RefreshSoon()
		case err != nil && prev.err == nil:
			e.health.Store(&healthState{err: err, since: now})
			e.log.Warn("engine unhealthy", "url", e.base, "err", err)
		case err != nil:
			// Keep the first time of the bad spell, with the latest reason.
			e.health.Store(&healthState{err: err, since: prev.since})
			if !aborted && e.cfg.UnhealthyAbort > 0 && now.Sub(prev.since) >= e.cfg.UnhealthyAbort && e.InFlight() > 0 {
				aborted = true
				e.log.Warn("engine unhealthy too long: ending requests in flight", "for", now.Sub(prev.since).Round(time.Second), "count", e.InFlight())
				e.abortAll(schemas.ErrEngineUnhealthy.New(e.name, e.base,
					fmt.Sprintf("unhealthy for %s: %v", now.Sub(prev.since).Round(time.Second), err)))
			}
		}
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
	}
}

// probe is one health check; its error is a 503 engine_unhealthy.
func (e *Engine) probe() error {
	bad := func(format string, args ...any) error {
		return schemas.ErrEngineUnhealthy.New(e.name, e.base, fmt.Sprintf(format, args...))
	}
	if e.proc != nil {
		if why := e.proc.down(); why != "" {
			return bad("%s", why)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.HealthTimeout)
	defer cancel()
	stop := context.AfterFunc(e.abortCtx(), cancel) // Close stops a slow probe
	defer stop()
	req, err := e.newRequest(ctx, http.MethodGet, e.cfg.HealthPath, nil)
	if err != nil {
		return bad("%v", err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return bad("%v", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return bad("GET %s answered %s", e.cfg.HealthPath, resp.Status)
	}
	return nil
}

// modelsLoop refreshes the model list every ModelsInterval and on request.
func (e *Engine) modelsLoop() {
	t := time.NewTicker(e.cfg.ModelsInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		case <-e.refresh:
		}
		if e.health.Load().err != nil {
			continue // it will be asked for again when the server is back
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.HealthTimeout)
		stop := context.AfterFunc(e.abortCtx(), cancel)
		if err := e.hooks.RefreshModels(ctx, e); err != nil {
			e.log.Warn("model list not refreshed", "err", err)
		}
		stop()
		cancel()
	}
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID     string `json:"id"`
	Parent string `json:"parent"` // the base model of a LoRA adapter (vLLM); "" for a base model
	Root   string `json:"root"`   // vLLM: the model's path, for an adapter the adapter's
}

// FetchModels reads GET /v1/models.
func (e *Engine) FetchModels(ctx context.Context) ([]Model, error) {
	status, body, err := e.Call(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if status/100 != 2 {
		return nil, e.Redact(UpstreamError(status, body))
	}
	return parseModels(body)
}

// refreshAll is the default RefreshModels: every id served (unless a
// static list is configured).
func (e *Engine) refreshAll(ctx context.Context, _ *Engine) error {
	if len(e.cfg.Models) > 0 {
		return nil
	}
	ms, err := e.FetchModels(ctx)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(ms))
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	e.SetModels(ids)
	return nil
}
