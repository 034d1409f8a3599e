package vllm

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// loras is the adapter table: which adapters vLLM has loaded, when each was
// last used, and the upstream loads and unloads in progress.
//
// Every upstream operation on an adapter is an op in ops, at most one per
// name: callers that want the same adapter wait for the op instead of
// starting another, which makes concurrent loads of one adapter a single
// POST. Making room evicts the least recently used adapter that no request
// is using (unloading it before the load); when every loaded adapter is in
// use the cap is exceeded rather than an adapter pulled from under a running
// request (vLLM keeps serving them, swapping between its GPU slots), and the
// table shrinks back at the next loads.
type loras struct {
	e *Engine

	mu     sync.Mutex
	paths  map[string]string   // name → path, for loads on demand
	loaded map[string]*adapter // what vLLM has loaded, as far as we know
	ops    map[string]*loraOp  // upstream operations in progress, by adapter
	clock  uint64              // use counter, for LRU order
	ver    uint64              // bumped by every local change, so a stale /v1/models read is ignored
}

type adapter struct {
	lastUse uint64
	inUse   int // requests running on it
}

type loraOp struct {
	load bool
	done chan struct{}
	err  error // set before done is closed
}

func newLoras(e *Engine, known map[string]string) *loras {
	m := &loras{e: e, paths: map[string]string{}, loaded: map[string]*adapter{}, ops: map[string]*loraOp{}}
	for k, v := range known {
		m.paths[k] = v
	}
	return m
}

// LoadAdapter loads adapter name from path (or its known path when path is
// ""), evicting the least recently used adapter if the engine is at
// MaxLoras, and counts as a use of it. An adapter already loaded (whatever
// its path), or one vLLM says is, is a success; concurrent calls for one
// adapter make one upstream load. The load runs on when ctx ends (others
// may wait for it); it is bounded by AdapterLoadTimeout.
func (e *Engine) LoadAdapter(ctx context.Context, name, path string) error {
	if name == "" {
		return schemas.BadRequest("name", "an adapter needs a name")
	}
	_, err := e.loras.ensure(ctx, name, path, false)
	return err
}

// UnloadAdapter unloads adapter name, even with requests running on it (an
// operator's order). One vLLM does not have is a success. Its path stays
// known, so a later request can load it again.
func (e *Engine) UnloadAdapter(ctx context.Context, name string) error {
	if name == "" {
		return schemas.BadRequest("name", "an adapter needs a name")
	}
	m := e.loras
	for {
		m.mu.Lock()
		if op := m.ops[name]; op != nil {
			m.mu.Unlock()
			if err := wait(ctx, op); err != nil {
				return err
			}
			continue
		}
		a := m.loaded[name]
		op := m.begin(name, false)
		delete(m.loaded, name)
		m.mu.Unlock()

		err := e.unloadUpstream(name)
		m.mu.Lock()
		if err != nil && a != nil {
			m.loaded[name] = a
		}
		m.end(name, op, err)
		m.mu.Unlock()
		e.core.RefreshSoon()
		return err
	}
}

// acquire gets model ready for a request: an adapter is marked used (and
// loaded first if it is known but not loaded); anything else passes. release
// ends the use.
func (m *loras) acquire(ctx context.Context, model string) (release func(), err error) {
	m.mu.Lock()
	_, known := m.paths[model]
	if m.loaded[model] == nil && m.ops[model] == nil && !known {
		m.mu.Unlock()
		return func() {}, nil // a base model, or one vLLM will answer 404 for
	}
	m.mu.Unlock()
	a, err := m.ensure(ctx, model, "", true)
	if err != nil {
		return nil, err
	}
	return func() {
		m.mu.Lock()
		a.inUse--
		m.mu.Unlock()
	}, nil
}

// ensure returns adapter name loaded and marked used (in use too if use),
// loading it if needed: see LoadAdapter.
func (m *loras) ensure(ctx context.Context, name, path string, use bool) (*adapter, error) {
	for {
		m.mu.Lock()
		if a := m.loaded[name]; a != nil {
			m.touch(a, use)
			m.mu.Unlock()
			return a, nil
		}
		if op := m.ops[name]; op != nil {
			m.mu.Unlock()
			if err := wait(ctx, op); err != nil {
				return nil, err
			}
			if op.load && op.err != nil {
				return nil, op.err
			}
			continue // loaded (or unloaded) meanwhile: look again (and mark the use)
		}
		if path == "" {
			path = m.paths[name]
		}
		if path == "" {
			m.mu.Unlock()
			return nil, schemas.BadRequest("path", "no path is known for adapter %q", name)
		}
		op := m.begin(name, true)
		victims := m.victims()
		m.mu.Unlock()
		// The load runs apart from its first caller: the others waiting for
		// it must not fail because that one gave up.
		go m.load(name, path, op, victims)
	}
}

// load unloads the victims, then loads name, and ends op.
func (m *loras) load(name, path string, op *loraOp, victims []string) {
	for _, v := range victims {
		m.evict(v)
	}
	err := m.e.loadUpstream(name, path)
	m.mu.Lock()
	if err == nil {
		m.paths[name] = path
		a := &adapter{}
		m.loaded[name] = a
		m.touch(a, false)
	}
	m.end(name, op, err)
	m.mu.Unlock()
	m.e.core.RefreshSoon()
}

func wait(ctx context.Context, op *loraOp) error {
	select {
	case <-op.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// begin records an upstream operation on name. m.mu is held.
func (m *loras) begin(name string, load bool) *loraOp {
	op := &loraOp{load: load, done: make(chan struct{})}
	m.ops[name] = op
	m.ver++
	return op
}

// end finishes op with err and wakes its waiters. m.mu is held.
func (m *loras) end(name string, op *loraOp, err error) {
	delete(m.ops, name)
	m.ver++
	op.err = err
	close(op.done)
}

func (m *loras) touch(a *adapter, use bool) {
	m.clock++
	a.lastUse = m.clock
	if use {
		a.inUse++
	}
}

// victims picks the adapters to unload to make room for the load just
// begun, takes them out of loaded and marks them as being unloaded. m.mu is
// held.
func (m *loras) victims() []string {
	limit := m.e.maxLoras()
	if limit <= 0 {
		return nil
	}
	n := len(m.loaded)
	for _, op := range m.ops {
		if op.load {
			n++
		}
	}
	var out []string
	for ; n > limit; n-- {
		victim, oldest := "", uint64(0)
		for name, a := range m.loaded {
			if a.inUse == 0 && m.ops[name] == nil && (victim == "" || a.lastUse < oldest) {
				victim, oldest = name, a.lastUse
			}
		}
		if victim == "" {
			m.e.core.Logger().Warn("every loaded adapter is in use: going over max_loras", "max_loras", limit, "loaded", n)
			break
		}
		delete(m.loaded, victim)
		m.begin(victim, false)
		out = append(out, victim)
	}
	return out
}

// evict unloads a victim picked by victims; on failure it stays in the table.
func (m *loras) evict(name string) {
	err := m.e.unloadUpstream(name)
	if err != nil {
		m.e.core.Logger().Warn("adapter not evicted", "adapter", name, "err", err)
	} else {
		m.e.core.Logger().Info("adapter evicted", "adapter", name)
	}
	m.mu.Lock()
	if err != nil {
		m.loaded[name] = &adapter{}
	}
	m.end(name, m.ops[name], err)
	m.mu.Unlock()
}

// names lists the loaded adapters, sorted.
func (m *loras) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return sortedKeys(m.loaded)
}

func (m *loras) version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ver
}

// sync takes the adapters /v1/models listed (name → path) as the truth,
// unless the table changed since the read began (version v) or is changing.
func (m *loras) sync(listed map[string]string, v uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ver != v || len(m.ops) > 0 {
		return
	}
	for name, root := range listed {
		if m.loaded[name] == nil {
			m.loaded[name] = &adapter{} // loaded by someone else: least recently used
		}
		if m.paths[name] == "" && root != "" {
			m.paths[name] = root
		}
	}
	for name := range m.loaded {
		if _, ok := listed[name]; !ok {
			delete(m.loaded, name)
		}
	}
}

// loadUpstream is POST /v1/load_lora_adapter; vLLM's "already loaded" (a
// 400) is a success.
func (e *Engine) loadUpstream(name, path string) error {
	body, _ := json.Marshal(map[string]string{"lora_name": name, "lora_path": path})
	err := e.loraCall("/v1/load_lora_adapter", name, body)
	if se, ok := err.(*schemas.Error); ok && se.Status == http.StatusBadRequest && strings.Contains(se.Body.Message, "already") {
		return nil
	}
	if err == nil {
		e.core.Logger().Info("adapter loaded", "adapter", name, "path", path)
	}
	return err
}

// unloadUpstream is POST /v1/unload_lora_adapter; an adapter vLLM does not
// have (its 404) is a success.
func (e *Engine) unloadUpstream(name string) error {
	body, _ := json.Marshal(map[string]string{"lora_name": name})
	err := e.loraCall("/v1/unload_lora_adapter", name, body)
	if se, ok := err.(*schemas.Error); ok && se.Status == http.StatusNotFound && se.Body.Code == nil {
		return nil
	}
	return err
}

// loraCall POSTs to a LoRA endpoint; a non-2xx answer becomes a
// *schemas.Error with vLLM's status and message, naming the adapter.
func (e *Engine) loraCall(path, name string, body []byte) error {
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.AdapterLoadTimeout)
	defer cancel()
	status, answer, err := e.core.Call(ctx, http.MethodPost, path, body)
	if err != nil {
		if e.ctx.Err() != nil {
			return schemas.Unavailable(schemas.CodeShuttingDown, 1, "the engine is shut down")
		}
		if ctx.Err() != nil {
			return schemas.Timeout("adapter %q: vLLM did not answer %s within %s", name, path, e.cfg.AdapterLoadTimeout)
		}
		return err
	}
	if status/100 == 2 {
		return nil
	}
	se := httpengine.UpstreamError(status, answer)
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
