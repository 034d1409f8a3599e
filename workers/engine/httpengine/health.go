package httpengine

import (
	"context"
	"errors"
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

// healthLoop judges health every HealthInterval, from outcomes first:
//   - the child process down: unhealthy;
//   - a response or stream bytes since the last look: healthy, no probe
//     (once a probe has passed: the first verdict is the probe's);
//   - probing off (HealthInterval < 0): healthy;
//   - a request in flight or sent since the last look: no probe (it would
//     queue behind generation, or interrupt it on a server that runs one
//     request at a time), the verdict stands, unless a request just failed
//     without an answer;
//   - else (idle) GET HealthPath, whose failure counts only if nothing was
//     served meanwhile and nothing is in flight.
//
// Requests in flight are never ended for a bad verdict: a dead server fails
// them by itself (connection refused or reset, StallTimeout), and a busy one
// must be left to finish them.
func (e *Engine) healthLoop() {
	every := e.cfg.HealthInterval
	if every < 0 {
		every = time.Second // only the child process and outcomes are looked at
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		e.judge()
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
	}
}

// judge makes one verdict (see healthLoop) and stores it.
func (e *Engine) judge() {
	o := &e.outcomes
	var err error
	started, failed, served := o.started.Swap(false), o.failed.Swap(false), o.served.Swap(false)
	// Until a probe has passed once, readiness is the probe's to say: a
	// server without the health path answers other requests too.
	served = served && (e.probedOK.Load() || e.cfg.HealthInterval < 0)
	down := ""
	if e.proc != nil {
		down = e.proc.down()
	}
	switch {
	case down != "":
		err = schemas.ErrEngineUnhealthy.New(e.name, e.base, down)
	case served:
	case e.cfg.HealthInterval < 0:
	case (started || e.InFlight() > 0) && !failed:
		return
	default:
		err = e.probe()
		if err != nil && (o.served.Load() || e.InFlight() > 0 && !failed) {
			// Busy, not dead: the probe waited behind requests that the
			// server is answering.
			return
		}
	}
	e.setHealth(err)
}

// setHealth stores a verdict and logs a change.
func (e *Engine) setHealth(err error) {
	prev := e.health.Load()
	if err == nil && e.proc != nil {
		e.proc.markHealthy()
	}
	switch {
	case err == nil && prev.err != nil:
		e.health.Store(&healthState{since: time.Now()})
		e.log.Info("engine healthy", "url", e.base)
		e.RefreshSoon()
	case err != nil && prev.err == nil:
		e.health.Store(&healthState{err: err, since: time.Now()})
		e.log.Warn("engine unhealthy", "url", e.base, "err", err)
	case err != nil:
		// Keep the first time of the bad spell, with the latest reason.
		e.health.Store(&healthState{err: err, since: prev.since})
	}
}

// ErrNoHealthPath is in WaitReady's error when the health path answered
// 404: the server has no such path, which waiting will not change.
var ErrNoHealthPath = errors.New("the server has no such path")

// probe is one health check; its error is a 503 engine_unhealthy.
func (e *Engine) probe() error {
	bad := func(format string, args ...any) error {
		return schemas.ErrEngineUnhealthy.New(e.name, e.base, fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.HealthTimeout)
	defer cancel()
	stop := context.AfterFunc(e.abortCtx(), cancel) // Close stops a slow probe
	defer stop()
	req, err := e.newRequest(ctx, http.MethodGet, e.cfg.HealthPath, nil)
	if err != nil {
		return bad("%v", err)
	}
	resp, err := e.bareClient.Do(req)
	if err != nil {
		return bad("%v", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		if !e.noPath.Swap(true) {
			e.log.Error("the engine has no health path: set the engine's health path to one it serves (e.g. /v1/models) or turn probing off",
				"url", e.base, "path", e.cfg.HealthPath)
		}
		return bad("GET %s answered %s: %v", e.cfg.HealthPath, resp.Status, ErrNoHealthPath)
	}
	e.noPath.Store(false)
	if resp.StatusCode/100 != 2 {
		return bad("GET %s answered %s", e.cfg.HealthPath, resp.Status)
	}
	e.probedOK.Store(true)
	return nil
}

// modelsLoop refreshes the model list every ModelsInterval and on request.
func (e *Engine) modelsLoop() {
	t := time.NewTicker(e.cfg.ModelsInterval)
	defer t.Stop()
	var asked bool // by RefreshSoon, not the ticker
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			asked = false
		case <-e.refresh:
			asked = true
		}
		if e.health.Load().err != nil {
			continue // it will be asked for again when the server is back
		}
		if !asked && e.InFlight() > 0 {
			continue // a periodic refresh waits for an idle server (see healthLoop)
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
	// MaxModelLen is the context length vLLM (and servers copying it)
	// reports; 0 when the server does not.
	MaxModelLen int `json:"max_model_len"`
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
	e.SetMaxModelLens(ms)
	return nil
}
