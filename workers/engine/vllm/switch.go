package vllm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// ModelCommand is one model a Switching engine can serve: the name clients
// ask for (vLLM must serve it under that name: --served-model-name) and the
// command line that starts a vLLM serving it.
type ModelCommand struct {
	Name    string
	Command string
}

// ParseModelCommand reads "name=command".
func ParseModelCommand(spec string) (ModelCommand, error) {
	name, cmd, ok := strings.Cut(spec, "=")
	name, cmd = strings.TrimSpace(name), strings.TrimSpace(cmd)
	if !ok || name == "" || cmd == "" {
		return ModelCommand{}, fmt.Errorf("%q is not name=command", spec)
	}
	return ModelCommand{Name: name, Command: cmd}, nil
}

// Switching is a vLLM worker of several models, one loaded at a time (a GPU
// holds one model's weights): one vLLM child process, started with the
// command of the model served now (engine.Switcher). Switch stops that
// process (SIGTERM, SIGKILL after StopGrace) and starts the other model's,
// waiting for its health as at start-up (StartTimeout); if the new one does
// not come up, the old model is started again and Switch fails. Between the
// two no model is served. Every other method is the current Engine's.
type Switching struct {
	cfg    Config // the template: each model's Engine gets its Command (and URL, unless set)
	models []ModelCommand

	switchMu sync.Mutex // one Switch at a time

	mu     sync.RWMutex
	cur    *Engine // nil between two processes
	name   string  // the model cur serves
	notify func()  // NotifyModels's, handed to each Engine
	closed bool
	pastKV engine.KVEventStats // the KV event counts of the engines closed (counters must not fall)
	kvOn   bool
	urlSet bool
}

var (
	_ engine.Engine         = (*Switching)(nil)
	_ engine.Switcher       = (*Switching)(nil)
	_ engine.Adapters       = (*Switching)(nil)
	_ engine.ContextLengths = (*Switching)(nil)
	_ engine.KVEventer      = (*Switching)(nil)
	_ engine.KVEventStatser = (*Switching)(nil)
	_ engine.ModelsNotifier = (*Switching)(nil)
)

// NewSwitching starts the first model's vLLM (cfg.Command must be empty:
// each model has its own). It does not wait for it (see WaitReady).
func NewSwitching(cfg Config, models []ModelCommand) (*Switching, error) {
	if cfg.Command != "" {
		return nil, errors.New("vllm: a switching engine takes a command per model, not Command")
	}
	if len(models) == 0 {
		return nil, errors.New("vllm: a switching engine needs models")
	}
	for i, m := range models {
		if m.Name == "" || m.Command == "" || slices.ContainsFunc(models[:i], func(o ModelCommand) bool { return o.Name == m.Name }) {
			return nil, fmt.Errorf("vllm: model %d (%q): a name and a command, each name once", i+1, m.Name)
		}
	}
	s := &Switching{cfg: cfg, models: slices.Clone(models), kvOn: cfg.KVEvents != "", urlSet: cfg.URL != ""}
	e, err := s.start(models[0])
	if err != nil {
		return nil, err
	}
	s.cur, s.name = e, models[0].Name
	return s, nil
}

// start starts the Engine of one model (its child process).
func (s *Switching) start(m ModelCommand) (*Engine, error) {
	cfg := s.cfg
	cfg.Command = m.Command
	cfg.Env = slices.Clone(s.cfg.Env)
	if !s.urlSet {
		cfg.URL = "" // from this command's --port
	}
	e, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("vllm: model %s: %w", m.Name, err)
	}
	s.mu.RLock()
	f := s.notify
	s.mu.RUnlock()
	if f != nil {
		e.NotifyModels(f)
	}
	return e, nil
}

// WaitReady waits for the current model's vLLM to be healthy, and checks
// that it serves the model under its name.
func (s *Switching) WaitReady(ctx context.Context) error {
	e, name := s.current()
	if e == nil {
		return s.errNone()
	}
	return waitServes(ctx, e, name)
}

// waitServes waits until e is healthy and lists model.
func waitServes(ctx context.Context, e *Engine, model string) error {
	if err := e.WaitReady(ctx); err != nil {
		return err
	}
	if ms := e.core.Models(); !slices.Contains(ms, model) {
		return fmt.Errorf("the vLLM started for model %s serves %q: give it --served-model-name %s", model, ms, model)
	}
	return nil
}

func (s *Switching) current() (*Engine, string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur, s.name
}

func (s *Switching) errNone() *schemas.Error {
	return schemas.ErrEngineUnhealthy.New("vllm", "this worker", "switching models")
}

// CanServe lists every model's name (engine.Switcher).
func (s *Switching) CanServe() []string {
	out := make([]string, len(s.models))
	for i, m := range s.models {
		out[i] = m.Name
	}
	return out
}

// Switch stops the vLLM of the model served now and starts model's
// (engine.Switcher). ctx bounds the wait for the new one, within
// StartTimeout; if it does not come up, the old model's vLLM is started
// again (bounded by StartTimeout alone) and the error says both.
func (s *Switching) Switch(ctx context.Context, model string) error {
	i := slices.IndexFunc(s.models, func(m ModelCommand) bool { return m.Name == model })
	if i < 0 {
		return schemas.ErrModelNotFound.New(model)
	}
	s.switchMu.Lock()
	defer s.switchMu.Unlock()
	s.mu.Lock()
	old, oldName, closed := s.cur, s.name, s.closed
	if closed {
		s.mu.Unlock()
		return schemas.ErrShuttingDown.New("vllm engine")
	}
	if oldName == model && old != nil {
		s.mu.Unlock()
		return nil
	}
	s.cur = nil // no model between the two processes
	s.mu.Unlock()
	s.modelsChanged()
	log := s.cfg.Logger
	if old != nil {
		s.retire(old)
	}
	e, err := s.start(s.models[i])
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, s.startTimeout())
		err = waitServes(wctx, e, model)
		cancel()
		if err != nil {
			s.retire(e)
		}
	}
	if err == nil {
		s.install(e, model)
		return nil
	}
	if ctx.Err() != nil {
		// The switch was called off (the worker is stopping): no old
		// model is started again only to be closed, for up to its start
		// timeout.
		return fmt.Errorf("vllm: switch to %s: %w (called off; no model serving)", model, err)
	}
	if log != nil {
		log.Error("vllm: the new model did not come up; starting the old one again", "model", model, "old", oldName, "err", err)
	}
	j := slices.IndexFunc(s.models, func(m ModelCommand) bool { return m.Name == oldName })
	back, berr := s.start(s.models[j])
	if berr == nil {
		wctx, cancel := context.WithTimeout(context.Background(), s.startTimeout())
		berr = waitServes(wctx, back, oldName)
		cancel()
		// Installed even if not ready yet: its process is restarted until
		// it is, and health says how it goes.
		s.install(back, oldName)
	}
	if berr != nil {
		return fmt.Errorf("vllm: switch to %s: %w; the old model %s: %v", model, err, oldName, berr)
	}
	return fmt.Errorf("vllm: switch to %s: %w (serving %s again)", model, err, oldName)
}

func (s *Switching) startTimeout() time.Duration {
	if s.cfg.StartTimeout > 0 {
		return s.cfg.StartTimeout
	}
	return 20 * time.Minute // httpengine's default
}

// retire closes an Engine (its child stops), keeping its KV event counts.
func (s *Switching) retire(e *Engine) {
	e.Close()
	st := e.KVEventStats()
	s.mu.Lock()
	addKVStats(&s.pastKV, st)
	s.mu.Unlock()
}

// install makes e the current Engine, unless the engine was closed meanwhile.
func (s *Switching) install(e *Engine, model string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		e.Close()
		return
	}
	s.cur, s.name = e, model
	s.mu.Unlock()
	s.modelsChanged()
}

func (s *Switching) modelsChanged() {
	s.mu.RLock()
	f := s.notify
	s.mu.RUnlock()
	if f != nil {
		f()
	}
}

func addKVStats(to *engine.KVEventStats, st engine.KVEventStats) {
	to.Received += st.Received
	to.DecodeErrors += st.DecodeErrors
	to.Unknown += st.Unknown
	to.Skipped += st.Skipped
	to.Connects += st.Connects
	to.Lost += st.Lost
	to.Mapped += st.Mapped
	to.Unmapped += st.Unmapped
	to.TokenizeCalls += st.TokenizeCalls
	to.TokenizeErrors += st.TokenizeErrors
	to.TokenizeDropped += st.TokenizeDropped
	to.TokenizeKnown += st.TokenizeKnown
}

// Name is "vllm".
func (s *Switching) Name() string { return "vllm" }

// NotifyModels sets f, called when the model list changes: the current
// vLLM's list, or a switch (engine.ModelsNotifier).
func (s *Switching) NotifyModels(f func()) {
	s.mu.Lock()
	s.notify = f
	e := s.cur
	s.mu.Unlock()
	if e != nil {
		e.NotifyModels(f)
	}
}

// Generate runs the request on the current vLLM; between two, a 503.
func (s *Switching) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	e, _ := s.current()
	if e == nil {
		return nil, s.errNone()
	}
	return e.Generate(ctx, req, sink)
}

// Models lists the current vLLM's models; none between two.
func (s *Switching) Models() []string {
	if e, _ := s.current(); e != nil {
		return e.Models()
	}
	return nil
}

// Stats are the current vLLM's; zero between two.
func (s *Switching) Stats() engine.Stats {
	if e, _ := s.current(); e != nil {
		return e.Stats()
	}
	return engine.Stats{}
}

// Health is the current vLLM's. Between two it is nil: a switch is no
// fault (the worker takes no request meanwhile), and a worker that looked
// unhealthy would count as capacity no switch away.
func (s *Switching) Health(ctx context.Context) error {
	s.mu.RLock()
	e, closed := s.cur, s.closed
	s.mu.RUnlock()
	switch {
	case closed:
		return schemas.ErrShuttingDown.New("vllm engine")
	case e == nil:
		return nil
	}
	return e.Health(ctx)
}

// Close stops the current vLLM; a switch under way ends with it.
func (s *Switching) Close() error {
	s.mu.Lock()
	s.closed = true
	e := s.cur
	s.cur = nil
	s.mu.Unlock()
	if e != nil {
		return e.Close()
	}
	return nil
}

// MaxModelLens are the current vLLM's.
func (s *Switching) MaxModelLens() map[string]int {
	if e, _ := s.current(); e != nil {
		return e.MaxModelLens()
	}
	return nil
}

// LoadAdapter loads an adapter into the current vLLM.
func (s *Switching) LoadAdapter(ctx context.Context, name, path string) error {
	e, _ := s.current()
	if e == nil {
		return s.errNone()
	}
	return e.LoadAdapter(ctx, name, path)
}

// UnloadAdapter unloads an adapter from the current vLLM.
func (s *Switching) UnloadAdapter(ctx context.Context, name string) error {
	e, _ := s.current()
	if e == nil {
		return s.errNone()
	}
	return e.UnloadAdapter(ctx, name)
}

// KVEventsOn: with Config.KVEvents, every model's vLLM reports them.
func (s *Switching) KVEventsOn() bool { return s.kvOn }

// DrainKVEvents are the current vLLM's. What the old one held needs no
// eviction: dispatchers name blocks with the model as their root, so the
// old model's match no prompt of the new one.
func (s *Switching) DrainKVEvents() (schemas.KVEvents, bool) {
	if e, _ := s.current(); e != nil {
		return e.DrainKVEvents()
	}
	return schemas.KVEvents{}, false
}

// KVEventStats sums the counts of every vLLM this engine ran.
func (s *Switching) KVEventStats() engine.KVEventStats {
	s.mu.RLock()
	st, e := s.pastKV, s.cur
	s.mu.RUnlock()
	if e != nil {
		addKVStats(&st, e.KVEventStats())
	}
	return st
}

// PID is the current child's process id (0 between two).
func (s *Switching) PID() int {
	if e, _ := s.current(); e != nil {
		return e.PID()
	}
	return 0
}

// URL is the current vLLM's root URL ("" between two).
func (s *Switching) URL() string {
	if e, _ := s.current(); e != nil {
		return e.URL()
	}
	return ""
}
