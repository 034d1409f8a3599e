package lora

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// fake is an in-memory engine with LoRA slots: the primitives the manager
// drives, and a log of what it was asked.
type fake struct {
	mu     sync.Mutex
	base   []string
	loaded []string // sorted
	max    int
	log    []string         // "load x", "unload y", in order
	peak   int              // most adapters loaded at once
	gate   chan struct{}    // non-nil: loads wait for it to close (or for their ctx)
	fail   map[string]error // load errors, by path
}

func newFake(max int) *fake { return &fake{base: []string{"b"}, max: max, fail: map[string]error{}} }

func (f *fake) Name() string { return "fake" }
func (f *fake) Generate(context.Context, *engine.Request, engine.Sink) (*engine.Result, error) {
	return &engine.Result{}, nil
}
func (f *fake) Health(context.Context) error { return nil }
func (f *fake) Close() error                 { return nil }

func (f *fake) Models() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(slices.Clone(f.base), f.loaded...)
}

func (f *fake) Stats() engine.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return engine.Stats{Adapters: slices.Clone(f.loaded), MaxLoras: f.max}
}

// LoadAdapter refuses what the real engines refuse: a second load of one
// adapter (vLLM's 400 "already loaded") and a load into full slots (the
// sim's 409), so a manager that relied on them would fail the tests.
func (f *fake) LoadAdapter(ctx context.Context, name, path string) error {
	f.mu.Lock()
	f.log = append(f.log, "load "+name)
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[path]; err != nil {
		return err
	}
	if slices.Contains(f.loaded, name) {
		return schemas.FromUpstream(400, schemas.TypeInvalidRequest, "", "lora_name", fmt.Sprintf("The lora adapter '%s' has already been loaded.", name))
	}
	if f.max > 0 && len(f.loaded) >= f.max {
		return schemas.FromUpstream(http.StatusConflict, schemas.TypeInvalidRequest, "adapter_slots_full", "", "all slots are in use")
	}
	f.loaded = append(f.loaded, name)
	slices.Sort(f.loaded)
	f.peak = max(f.peak, len(f.loaded))
	return nil
}

func (f *fake) UnloadAdapter(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.Index(f.loaded, name)
	if i < 0 {
		return schemas.FromUpstream(http.StatusNotFound, schemas.TypeNotFound, "", "lora_name", fmt.Sprintf("The lora adapter '%s' cannot be found.", name))
	}
	f.log = append(f.log, "unload "+name)
	f.loaded = slices.Delete(f.loaded, i, i+1)
	return nil
}

// add loads an adapter behind the manager's back (as --lora-modules does).
func (f *fake) add(name string) {
	f.mu.Lock()
	f.loaded = append(f.loaded, name)
	slices.Sort(f.loaded)
	f.mu.Unlock()
}

func (f *fake) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func (f *fake) maxLoaded() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peak
}

// noAdapters is an engine without engine.Adapters (as the openai engine).
type noAdapters struct{ *fake }

func (noAdapters) LoadAdapter() {} // hides fake's: not engine.Adapters any more

// beat is what a heartbeat sent when Changed was called would carry.
type beat struct {
	loading, adapters []string
}

type beats struct {
	mu  sync.Mutex
	got []beat
}

func (b *beats) all() []beat {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.got)
}

// newManager is a manager over eng as the worker "w1" makes it, recording
// what a heartbeat would carry every time it calls Changed.
func newManager(t *testing.T, eng engine.Engine, cfg Config) (*Manager, *beats) {
	t.Helper()
	b := &beats{}
	var m *Manager
	cfg.Worker = "w1"
	cfg.Changed = func() {
		hb := beat{loading: m.Loading(), adapters: eng.Stats().Adapters}
		b.mu.Lock()
		b.got = append(b.got, hb)
		b.mu.Unlock()
	}
	m = New(eng, cfg)
	return m, b
}

// run1 runs one request on model: acquire, then release at once.
func run1(t *testing.T, m *Manager, model, path string) {
	t.Helper()
	release, err := m.Acquire(t.Context(), model, "b", path)
	if err != nil {
		t.Fatalf("acquire %s: %v", model, err)
	}
	release()
}

func (m *Manager) waiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waiting
}

func (m *Manager) unloading(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.ops[name]
	return o != nil && !o.load
}

// opWaiters is how many callers wait for the operation on name.
func (m *Manager) opWaiters(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o := m.ops[name]; o != nil {
		return o.waiters
	}
	return 0
}
