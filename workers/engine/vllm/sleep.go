package vllm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// Sleep mode (engine.Sleeper): vLLM's POST /sleep?level=N, POST /wake_up
// and GET /is_sleeping, development routes that vLLM serves only with
// VLLM_SERVER_DEV_MODE=1 in its environment, and that work only for a vLLM
// started with --enable-sleep-mode. Level 1 moves the weights to CPU memory
// and frees the KV cache (and, with KV events on, vLLM says
// AllBlocksCleared); a sleeping vLLM still answers /health, /v1/models and
// /tokenize, but must get no generation. Checked against vLLM's source
// (vllm/entrypoints/serve/dev/sleep/api_router.py): both POSTs answer an
// empty 200 once done.

// EnvDevMode is what a child process gets in its environment with
// Config.SleepMode, so that vLLM serves its sleep routes.
const EnvDevMode = "VLLM_SERVER_DEV_MODE=1"

// flagSleepMode is vLLM's flag that enables sleep mode.
const flagSleepMode = "--enable-sleep-mode"

// sleepConfig checks and completes cfg for sleep mode, before the child
// starts.
func sleepConfig(cfg *Config) error {
	if cfg.SleepLevel == 0 {
		cfg.SleepLevel = 1
	}
	if cfg.SleepLevel < 0 || cfg.SleepLevel > 2 {
		return fmt.Errorf("vllm engine: sleep level %d: vLLM has levels 1 and 2", cfg.SleepLevel)
	}
	if cfg.SleepTimeout <= 0 {
		cfg.SleepTimeout = 5 * time.Minute
	}
	if !cfg.SleepMode || cfg.Command == "" {
		return nil // attached by URL: RefreshSleeping checks the server
	}
	if !hasFlag(cfg.Command, flagSleepMode) {
		return fmt.Errorf("vllm engine: sleeping when idle needs vLLM's sleep mode: add %s to the command (%q)", flagSleepMode, cfg.Command)
	}
	cfg.Env = append(cfg.Env, EnvDevMode)
	return nil
}

// hasFlag reports whether cmd has the boolean flag name (--name or
// --name=value).
func hasFlag(cmd, name string) bool {
	for _, f := range strings.Fields(cmd) {
		f = strings.Trim(f, `'"`)
		if f == name || strings.HasPrefix(f, name+"=") {
			return true
		}
	}
	return false
}

// Sleep is POST /sleep?level=<Config.SleepLevel>, bounded by ctx,
// Config.SleepTimeout and Close. Nothing may run on vLLM meanwhile (its
// default is to abort what runs): the worker sleeps only an idle engine.
func (e *Engine) Sleep(ctx context.Context) error {
	err := e.sleepCall(ctx, "/sleep?level="+strconv.Itoa(e.cfg.SleepLevel))
	if err == nil {
		e.setSleeping(true)
	}
	return err
}

// WakeUp is POST /wake_up (every tag: weights and KV cache), bounded as
// Sleep. When it returns nil vLLM serves again.
func (e *Engine) WakeUp(ctx context.Context) error {
	err := e.sleepCall(ctx, "/wake_up")
	if err == nil {
		e.setSleeping(false)
	}
	return err
}

// Sleeping is the engine's last word on vLLM's sleep: from Sleep, WakeUp
// and RefreshSleeping (no I/O); a child process started again since comes
// back awake.
func (e *Engine) Sleeping() bool {
	at := e.sleptAt.Load()
	return at >= 0 && at == int64(e.core.Restarts())
}

// setSleeping records vLLM's sleep: asleep as of the child's current start.
func (e *Engine) setSleeping(asleep bool) {
	at := int64(-1)
	if asleep {
		at = int64(e.core.Restarts())
	}
	e.sleptAt.Store(at)
}

// RefreshSleeping reads GET /is_sleeping, and keeps it for Sleeping. A
// vLLM without the route (FastAPI's 404) was started without
// VLLM_SERVER_DEV_MODE=1: the error says so.
func (e *Engine) RefreshSleeping(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(e.cfg.HealthTimeout, 5*time.Second))
	defer cancel()
	defer context.AfterFunc(e.ctx, cancel)()
	status, body, err := e.core.Call(ctx, http.MethodGet, "/is_sleeping", nil)
	if err != nil {
		return false, err
	}
	if status/100 != 2 {
		return false, e.sleepError(status, body, "/is_sleeping")
	}
	var v struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if json.Unmarshal(body, &v) != nil || v.IsSleeping == nil {
		return false, schemas.ErrEngine.New(fmt.Sprintf("GET /is_sleeping answered %q, not {\"is_sleeping\": bool}", schemas.Clip(string(body), 200)))
	}
	e.setSleeping(*v.IsSleeping)
	return *v.IsSleeping, nil
}

// sleepCall POSTs to a sleep route. On failure vLLM's state is read
// again, so that Sleeping tells what it is (a sleep that timed out here
// may have happened there).
func (e *Engine) sleepCall(ctx context.Context, path string) error {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.SleepTimeout)
	defer cancel()
	defer context.AfterFunc(e.ctx, cancel)() // Close ends it too
	status, body, err := e.core.Call(cctx, http.MethodPost, path, nil)
	switch {
	case err != nil && e.ctx.Err() != nil:
		return schemas.ErrShuttingDown.New("engine")
	case err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		err = schemas.ErrEngineTimeout.New("POST " + path)
	case err == nil && status/100 != 2:
		err = e.sleepError(status, body, path)
	case err == nil:
		return nil
	}
	_, _ = e.RefreshSleeping(context.WithoutCancel(ctx))
	return err
}

// sleepError is a sleep route's error answer, with what to do about the
// commonest: the routes missing (no VLLM_SERVER_DEV_MODE=1).
func (e *Engine) sleepError(status int, body []byte, path string) *schemas.Error {
	se := e.core.Redact(httpengine.UpstreamError(status, body))
	if status == http.StatusNotFound && se.Body.Message == "Not Found" {
		se.Body.Message = "vLLM has no sleep routes (" + path + "): start it with " + EnvDevMode + " and " + flagSleepMode
		return se
	}
	se.Body.Message = path + ": " + se.Body.Message
	return se
}
