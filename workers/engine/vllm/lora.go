package vllm

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// vLLM's messages that tokenbus recognises (same wording since vLLM 0.6, checked
// against 0.33.0): a load of a name it has, and a failure of its engine core.
const (
	msgAlreadyLoaded = "has already been loaded"
	msgEngineDead    = "EngineCore encountered an issue"
)

// loaded is the engine's view of the adapters vLLM has loaded: what
// /v1/models listed (entries with a parent), plus the engine's own loads and
// unloads since. Deciding what to load, when and what to evict is not the
// engine's business but the worker's adapter manager's (workers/lora).
type loaded struct {
	mu    sync.Mutex
	names map[string]struct{}
	ver   uint64 // bumped by every local change, so a stale /v1/models read is ignored
	busy  int    // upstream loads and unloads in progress
}

// LoadAdapter is POST /v1/load_lora_adapter {"lora_name","lora_path"},
// bounded by ctx (and Close). vLLM's "already loaded" (a 400) is a success;
// an adapter it refuses (its 500) is a 422.
// A vLLM without the runtime LoRA API answers a 404 lora_api_disabled.
func (e *Engine) LoadAdapter(ctx context.Context, name, path string) error {
	if name == "" {
		return schemas.ErrAdapterName.At("lora_name")
	}
	if path == "" {
		return schemas.ErrAdapterNoPath.At("lora_path", name)
	}
	body, _ := json.Marshal(map[string]string{"lora_name": name, "lora_path": path})
	e.adapters.begin()
	err := e.loraCall(ctx, "/v1/load_lora_adapter", name, body)
	if se, ok := err.(*schemas.Error); ok {
		switch {
		case se.Status == http.StatusBadRequest && strings.Contains(se.Body.Message, msgAlreadyLoaded):
			err = nil
		case se.Status == http.StatusInternalServerError && !strings.Contains(se.Body.Message, msgEngineDead):
			// vLLM answers 500 for any adapter its engine core refuses (a
			// rank over --max-lora-rank, no tensors, unsupported modules):
			// the adapter is at fault, and loading it again fails again.
			// 422 tells the adapter manager so (adapter_load_failed, no
			// retry). A dead engine core keeps its 500 (retry elsewhere).
			se.Status = http.StatusUnprocessableEntity
			se.Body.Type = schemas.TypeInvalidRequest
		}
	}
	e.adapters.end(name, err == nil, true)
	e.core.RefreshSoon()
	return err
}

// UnloadAdapter is POST /v1/unload_lora_adapter {"lora_name"}, bounded by
// ctx (and Close). An adapter vLLM does not have (its 404) is a success.
// Requests running on the adapter are vLLM's business (it lets them finish).
func (e *Engine) UnloadAdapter(ctx context.Context, name string) error {
	if name == "" {
		return schemas.ErrAdapterName.At("lora_name")
	}
	body, _ := json.Marshal(map[string]string{"lora_name": name})
	e.adapters.begin()
	err := e.loraCall(ctx, "/v1/unload_lora_adapter", name, body)
	if se, ok := err.(*schemas.Error); ok && se.Status == http.StatusNotFound && se.Body.Code == nil {
		err = nil
	}
	e.adapters.end(name, err == nil, false)
	e.core.RefreshSoon()
	return err
}

// begin records an upstream call in progress.
func (l *loaded) begin() {
	l.mu.Lock()
	l.busy++
	l.ver++
	l.mu.Unlock()
}

// end records an upstream call's end: name is now loaded (or not) if ok.
func (l *loaded) end(name string, ok, load bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy--
	l.ver++
	if !ok {
		return
	}
	if load {
		l.names[name] = struct{}{}
	} else {
		delete(l.names, name)
	}
}

// list returns the loaded adapters, sorted.
func (l *loaded) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return sortedKeys(l.names)
}

// has reports whether name is a loaded adapter.
func (l *loaded) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.names[name]
	return ok
}

func (l *loaded) version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ver
}

// sync takes the adapters /v1/models listed as the truth, unless a local
// load or unload ended since the read began (version v) or is under way:
// the read may predate it and would undo it.
func (l *loaded) sync(listed map[string]struct{}, v uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ver != v || l.busy > 0 {
		return
	}
	l.names = listed
}

// loraCall POSTs to a LoRA endpoint; a non-2xx answer becomes a
// *schemas.Error with vLLM's status and message, naming the adapter.
func (e *Engine) loraCall(ctx context.Context, path, name string, body []byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.ctx, cancel)() // Close ends it too
	status, answer, err := e.core.Call(ctx, http.MethodPost, path, body)
	if err != nil {
		if e.ctx.Err() != nil {
			return schemas.ErrShuttingDown.New("engine")
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return schemas.ErrEngineTimeout.New(path + " for adapter " + name)
		}
		return err
	}
	if status/100 == 2 {
		return nil
	}
	se := e.core.Redact(httpengine.UpstreamError(status, answer))
	if status == http.StatusNotFound && se.Body.Message == "Not Found" {
		// FastAPI's answer for a route that does not exist.
		se.Body.Message = "vLLM has no runtime LoRA API: start it with " + EnvRuntimeLoRA
		code := "lora_api_disabled"
		se.Body.Code = &code
		return se
	}
	se.Body.Message = "adapter " + name + ": " + se.Body.Message
	return se
}
