package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// AdapterStats counts what the worker's adapter manager did.
type AdapterStats struct {
	Loads        uint64 // adapters loaded, on demand or by a control request
	LoadFailures uint64 // loads the engine failed
	Evictions    uint64 // adapters unloaded to make room for another
	Unloads      uint64 // adapters unloaded by a control request
}

// AdapterStats returns the adapter manager's counters.
func (w *Worker) AdapterStats() AdapterStats {
	m := w.adapters
	return AdapterStats{Loads: m.loads.Load(), LoadFailures: m.failures.Load(),
		Evictions: m.evictions.Load(), Unloads: m.unloads.Load()}
}

// adapterManager loads LoRA adapters into the engine (engine.Adapters) when
// requests need them, and is the one way the worker loads and unloads them:
//
//   - A request for a model the engine does not serve, carrying the
//     adapter's path (HdrAdapterPath, set by the dispatcher from the
//     registry), loads it before it runs. Loads are coalesced: there is at
//     most one operation (load or unload) per adapter at a time, and every
//     request that wants the adapter meanwhile waits for it and shares its
//     result. A load runs apart from the request that started it (so the
//     others do not fail when that one is cancelled), bounded by
//     Config.AdapterLoadTimeout.
//   - When the engine's LoRA slots (Stats().MaxLoras; 0: no limit) are all
//     taken, the least recently used adapter that no request is running on
//     is evicted first. When every loaded adapter is in use the request
//     waits until one is free (or its context ends) rather than pull an
//     adapter from under a running request.
//   - The worker heartbeats at once when a load starts (the adapter is
//     listed under Loading, so every dispatcher sends the next requests for
//     it here) and when it ends or an adapter is unloaded.
//
// The engine's own list of loaded adapters (Stats().Adapters) is the truth;
// the manager adds what the engine does not know: uses, recency and the
// operations in progress.
type adapterManager struct {
	w           *Worker
	ad          engine.Adapters // nil: the engine cannot load adapters
	loadTimeout time.Duration
	grace       time.Duration

	mu      sync.Mutex
	uses    map[string]*adapterUse
	ops     map[string]*adapterOp
	changed chan struct{} // closed and replaced when a use ends or an operation ends
	clock   uint64

	loads, failures, evictions, unloads atomic.Uint64
}

type adapterUse struct {
	lastUse uint64
	inUse   int // requests running on it
}

type adapterOp struct {
	load bool
	done chan struct{}
	err  error // set before done is closed
}

func newAdapterManager(w *Worker) *adapterManager {
	m := &adapterManager{w: w, loadTimeout: w.cfg.AdapterLoadTimeout, grace: w.cfg.AdapterUnloadGrace,
		uses: map[string]*adapterUse{}, ops: map[string]*adapterOp{}, changed: make(chan struct{})}
	m.ad, _ = w.eng.(engine.Adapters)
	return m
}

func noRelease() {}

// acquire gets model ready for a request and marks it in use until release
// is called. A request is for an adapter when the dispatcher says so (base
// or path set) or the manager knows it; anything else passes straight
// through (base models: the engine decides).
func (m *adapterManager) acquire(ctx context.Context, model, base, path string) (release func(), err error) {
	m.mu.Lock()
	tracked := m.uses[model] != nil || m.ops[model] != nil
	m.mu.Unlock()
	if path == "" && base == "" && !tracked {
		return noRelease, nil
	}
	if m.ad == nil {
		if slices.Contains(m.w.eng.Models(), model) {
			return noRelease, nil
		}
		return nil, m.loadError(model, path, schemas.BadRequest("", "engine %s cannot load LoRA adapters", m.w.eng.Name()))
	}
	u, err := m.ensure(ctx, model, base, path, true)
	if err != nil || u == nil {
		return noRelease, err
	}
	return func() {
		m.mu.Lock()
		u.inUse--
		m.touch(u)
		m.signalLocked()
		m.mu.Unlock()
	}, nil
}

// load loads adapter name from path for a control request (without a use).
func (m *adapterManager) load(ctx context.Context, name, base, path string) error {
	if path == "" {
		return schemas.BadRequest("path", "loading adapter %q needs its path", name)
	}
	_, err := m.ensure(ctx, name, base, path, false)
	return err
}

// ensure returns adapter name loaded and touched (and in use if use),
// loading it first if needed; see adapterManager. A nil use with a nil
// error means the adapter is not loaded and nothing says where it is: the
// engine answers the request itself.
func (m *adapterManager) ensure(ctx context.Context, name, base, path string, use bool) (*adapterUse, error) {
	for {
		m.mu.Lock()
		if op := m.ops[name]; op != nil {
			m.mu.Unlock()
			if err := waitOp(ctx, op.done); err != nil {
				return nil, err
			}
			if op.load && op.err != nil {
				return nil, op.err
			}
			continue // loaded or unloaded meanwhile: look again
		}
		st := m.w.eng.Stats()
		if slices.Contains(st.Adapters, name) {
			u := m.useLocked(name)
			if use {
				u.inUse++
			}
			m.touch(u)
			m.mu.Unlock()
			return u, nil
		}
		if path == "" {
			m.mu.Unlock()
			if base != "" {
				return nil, m.loadError(name, "", schemas.BadRequest("", "the registry has no path for it"))
			}
			return nil, nil
		}
		if base != "" && !slices.Contains(m.w.eng.Models(), base) {
			m.mu.Unlock()
			return nil, m.loadError(name, path, schemas.BadRequest("", "this worker does not serve base model %q", base))
		}
		victim, full := m.victimLocked(st)
		if full && victim == "" {
			// Every slot holds an adapter a request is running on: wait
			// for one to end.
			ch := m.changed
			m.mu.Unlock()
			if err := waitOp(ctx, ch); err != nil {
				return nil, err
			}
			continue
		}
		op := m.beginLocked(name, true)
		var evict *adapterOp
		if victim != "" {
			evict = m.beginLocked(victim, false)
		}
		m.mu.Unlock()
		m.w.beatSoon() // dispatchers learn that the load is under way
		go m.run(name, path, op, victim, evict)
	}
}

// victimLocked reports whether the engine's slots are all taken (loaded
// adapters and loads in progress) and, if so, the least recently used
// loaded adapter no request uses and no operation touches ("" if none).
func (m *adapterManager) victimLocked(st engine.Stats) (victim string, full bool) {
	if st.MaxLoras <= 0 {
		return "", false
	}
	taken := len(st.Adapters)
	for name, op := range m.ops {
		if op.load && !slices.Contains(st.Adapters, name) {
			taken++
		}
	}
	if taken < st.MaxLoras {
		return "", false
	}
	oldest := uint64(0)
	for _, name := range st.Adapters {
		if m.ops[name] != nil {
			continue
		}
		var last uint64 // an adapter loaded behind our back counts as least recently used
		if u := m.uses[name]; u != nil {
			if u.inUse > 0 {
				continue
			}
			last = u.lastUse
		}
		if victim == "" || last < oldest {
			victim, oldest = name, last
		}
	}
	return victim, true
}

// run evicts victim (if any), then loads name, and ends both operations.
func (m *adapterManager) run(name, path string, op *adapterOp, victim string, evict *adapterOp) {
	ctx, cancel := context.WithTimeout(context.Background(), m.loadTimeout)
	defer cancel()
	if victim != "" {
		err := m.unloadEngine(ctx, victim)
		m.mu.Lock()
		if err == nil {
			delete(m.uses, victim)
			m.evictions.Add(1)
		}
		m.endLocked(victim, evict, err)
		m.mu.Unlock()
		if err != nil {
			m.w.log.Warn("adapter not evicted", "adapter", victim, "err", err)
		} else {
			m.w.log.Info("adapter evicted", "adapter", victim, "for", name)
		}
	}
	start := time.Now()
	err := m.ad.LoadAdapter(ctx, name, path)
	if err != nil && slices.Contains(m.w.eng.Stats().Adapters, name) {
		err = nil // loaded meanwhile by someone else (the engine says "already loaded")
	}
	m.mu.Lock()
	if err == nil {
		m.loads.Add(1)
		m.touch(m.useLocked(name))
	} else {
		m.failures.Add(1)
		err = m.loadError(name, path, err)
	}
	m.endLocked(name, op, err)
	m.mu.Unlock()
	if err != nil {
		m.w.log.Warn("adapter load failed", "adapter", name, "path", path, "err", err)
	} else {
		m.w.log.Info("adapter loaded", "adapter", name, "path", path, "took", time.Since(start))
	}
	m.w.beatSoon()
}

// unload unloads adapter name for a control request (the registry dropped
// it): new requests for it wait, those running on it may finish for up to
// the unload grace period, then it is unloaded whatever runs on it. An
// adapter the engine does not have is a success.
func (m *adapterManager) unload(ctx context.Context, name string) error {
	for {
		m.mu.Lock()
		if op := m.ops[name]; op != nil {
			m.mu.Unlock()
			if err := waitOp(ctx, op.done); err != nil {
				return err
			}
			continue
		}
		if !slices.Contains(m.w.eng.Stats().Adapters, name) {
			delete(m.uses, name)
			m.mu.Unlock()
			return nil
		}
		op := m.beginLocked(name, false)
		m.mu.Unlock()

		grace := time.NewTimer(m.grace)
		for waiting := true; waiting; {
			m.mu.Lock()
			busy := m.uses[name] != nil && m.uses[name].inUse > 0
			ch := m.changed
			m.mu.Unlock()
			if !busy {
				break
			}
			select {
			case <-ch:
			case <-grace.C:
				m.w.log.Warn("unloading an adapter requests still run on", "adapter", name)
				waiting = false
			case <-ctx.Done():
				waiting = false
			}
		}
		grace.Stop()
		err := m.unloadEngine(context.WithoutCancel(ctx), name)
		m.mu.Lock()
		if err == nil {
			delete(m.uses, name)
			m.unloads.Add(1)
		}
		m.endLocked(name, op, err)
		m.mu.Unlock()
		m.w.beatSoon()
		return err
	}
}

// unloadEngine unloads from the engine; one it does not have is a success.
func (m *adapterManager) unloadEngine(ctx context.Context, name string) error {
	err := m.ad.UnloadAdapter(ctx, name)
	if err != nil && !slices.Contains(m.w.eng.Stats().Adapters, name) {
		var se *schemas.Error
		if errors.As(err, &se) && se.Status == http.StatusNotFound {
			return nil
		}
	}
	return err
}

// loading lists the adapters being loaded, sorted.
func (m *adapterManager) loading() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name, op := range m.ops {
		if op.load {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// loadError is what a request for an adapter that cannot be loaded gets: a
// 503 to retry for an engine that is down, overloaded or slow, a 500 for a
// load the engine refused (a bad path: retrying does not help), both with
// code adapter_load_failed and the engine's message.
func (m *adapterManager) loadError(name, path string, err error) *schemas.Error {
	var se *schemas.Error
	if errors.As(err, &se) && se.Body.Code != nil && *se.Body.Code == schemas.CodeAdapterLoadFailed {
		return se
	}
	cause := schemas.AsError(err)
	msg := fmt.Sprintf("cannot load LoRA adapter `%s`", name)
	if path != "" {
		msg += fmt.Sprintf(" from `%s`", path)
	}
	msg += fmt.Sprintf(" on worker %s: %s", m.w.cfg.ID, cause.Body.Message)
	if cause.Status >= 400 && cause.Status < 500 && cause.Status != http.StatusRequestTimeout &&
		cause.Status != http.StatusTooManyRequests && cause.Status != 499 {
		return schemas.NewError(http.StatusInternalServerError, schemas.TypeServer, schemas.CodeAdapterLoadFailed, "model", msg)
	}
	e := schemas.NewError(http.StatusServiceUnavailable, schemas.TypeOverloaded, schemas.CodeAdapterLoadFailed, "model", msg)
	e.RetryAfter = 1
	return e
}

func (m *adapterManager) useLocked(name string) *adapterUse {
	u := m.uses[name]
	if u == nil {
		u = &adapterUse{}
		m.uses[name] = u
	}
	return u
}

func (m *adapterManager) touch(u *adapterUse) {
	m.clock++
	u.lastUse = m.clock
}

func (m *adapterManager) beginLocked(name string, load bool) *adapterOp {
	op := &adapterOp{load: load, done: make(chan struct{})}
	m.ops[name] = op
	return op
}

func (m *adapterManager) endLocked(name string, op *adapterOp, err error) {
	if m.ops[name] == op {
		delete(m.ops, name)
	}
	op.err = err
	close(op.done)
	m.signalLocked()
}

func (m *adapterManager) signalLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func waitOp(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
