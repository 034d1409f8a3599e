package lora

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/internal/decay"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Config tunes a Manager. Zero values take the defaults shown.
type Config struct {
	Worker      string        // the worker's id, named in error messages
	LoadTimeout time.Duration // longest one load (or eviction, or unload) may take; default 5m
	// UnloadGrace is how long Unload waits for the requests running on the
	// adapter before it unloads it anyway; default 5s.
	UnloadGrace time.Duration
	Logger      *slog.Logger // nil: none
	// HalfLife is how fast an adapter's request rate, which eviction goes
	// by, forgets: a request counts half as much HalfLife later. Default
	// 10s, as the dispatcher's demand rate (dispatcher.PlacementConfig).
	HalfLife time.Duration
	// Now is the clock of the request rates; default time.Now (tests
	// inject one).
	Now func() time.Time
	// Changed is called, with no lock held, when a load starts, when it
	// ends and when an adapter is unloaded (the worker heartbeats at once).
	// It must not block.
	Changed func()
}

// Stats counts what a Manager did.
type Stats struct {
	Loads        uint64 // adapters loaded, for a request or by Load
	LoadFailures uint64 // loads the engine failed
	Evictions    uint64 // adapters unloaded to make room for another
	Unloads      uint64 // adapters unloaded by Unload
}

// Manager loads and unloads one engine's LoRA adapters; see the package doc.
type Manager struct {
	eng engine.Engine
	ad  engine.Adapters // nil: the engine cannot load adapters
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	uses    map[string]*use
	ops     map[string]*op
	changed chan struct{} // closed and replaced when a use ends or an operation ends
	clock   uint64
	waiting int // callers waiting for a free slot (for tests)

	loads, failures, evictions, unloads atomic.Uint64
}

// use is what the manager knows of an adapter loaded, or wanted by a
// request: an entry lives while the adapter is loaded or a request runs on
// or waits for it.
type use struct {
	lastUse uint64
	inUse   int // requests running on it
	wanted  int // requests waiting for it (its load, a slot): pinned as if running
	// rate is the adapter's request rate (requests/s, decayed with
	// Config.HalfLife): eviction takes the lowest.
	rate decay.Rate
}

type op struct {
	load    bool
	done    chan struct{}
	err     error // set before done is closed
	waiters int   // callers of ensure waiting for it (for tests)
}

// New makes the manager of eng's adapters. An engine that does not
// implement engine.Adapters has none to load: requests for the adapters it
// serves by itself pass, the others fail.
func New(eng engine.Engine, cfg Config) *Manager {
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = 5 * time.Minute
	}
	if cfg.UnloadGrace <= 0 {
		cfg.UnloadGrace = 5 * time.Second
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{eng: eng, cfg: cfg, log: log, uses: map[string]*use{}, ops: map[string]*op{}, changed: make(chan struct{})}
	m.ad, _ = eng.(engine.Adapters)
	return m
}

// CanLoad reports whether the engine can load adapters at run time.
func (m *Manager) CanLoad() bool { return m.ad != nil }

// Stats returns the manager's counters.
func (m *Manager) Stats() Stats {
	return Stats{Loads: m.loads.Load(), LoadFailures: m.failures.Load(),
		Evictions: m.evictions.Load(), Unloads: m.unloads.Load()}
}

func noRelease() {}

// Acquire gets model ready for a request and marks it in use until release
// is called. A request is for an adapter when the dispatcher says so (base
// or path set) or the manager knows the name; anything else passes straight
// through (base models, unknown names: the engine answers). A load that
// fails is a *schemas.Error with code adapter_load_failed.
func (m *Manager) Acquire(ctx context.Context, model, base, path string) (release func(), err error) {
	m.mu.Lock()
	tracked := m.uses[model] != nil || m.ops[model] != nil
	m.mu.Unlock()
	if path == "" && base == "" && !tracked {
		return noRelease, nil
	}
	if m.ad == nil {
		if slices.Contains(m.eng.Models(), model) {
			return noRelease, nil
		}
		return nil, m.loadError(model, path, schemas.ErrAdaptersUnsupported.New(m.eng.Name()))
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

// Load loads adapter name from path (for a control request: no use). An
// adapter already loaded is a success and loads nothing.
func (m *Manager) Load(ctx context.Context, name, base, path string) error {
	if m.ad == nil {
		return schemas.ErrAdaptersUnsupported.New(m.eng.Name())
	}
	if path == "" {
		return schemas.ErrAdapterNoPath.At("path", name)
	}
	_, err := m.ensure(ctx, name, base, path, false)
	return err
}

// ensure returns adapter name loaded and touched (and in use if inUse: a
// request, counted in the adapter's rate), loading it first if needed. A
// nil use with a nil error means the adapter is not loaded and nothing says
// where it is: the engine answers the request itself.
func (m *Manager) ensure(ctx context.Context, name, base, path string, inUse bool) (*use, error) {
	if !inUse {
		return m.ensureLoaded(ctx, name, base, path, nil)
	}
	// The request counts (and pins the adapter, once loaded) from now, not
	// from when it gets the adapter: a load just ended must not be evicted
	// for another before the requests that waited for it take it.
	m.mu.Lock()
	want := m.useLocked(name)
	want.rate.Count(m.cfg.Now(), m.cfg.HalfLife)
	want.wanted++
	m.mu.Unlock()
	u, err := m.ensureLoaded(ctx, name, base, path, want)
	if u == nil {
		m.mu.Lock()
		want.wanted--
		m.dropIdleLocked(name, want)
		m.mu.Unlock()
	}
	return u, err
}

// dropIdleLocked forgets u (name's entry) if no request runs on or waits
// for it and the engine does not have the adapter.
func (m *Manager) dropIdleLocked(name string, u *use) {
	if u.inUse == 0 && u.wanted == 0 && m.uses[name] == u && m.ops[name] == nil &&
		!slices.Contains(m.eng.Stats().Adapters, name) {
		delete(m.uses, name)
	}
}

// ensureLoaded is ensure's loop; want is the request's entry (nil for a
// control load), whose wait becomes a use in the step that finds the
// adapter loaded.
func (m *Manager) ensureLoaded(ctx context.Context, name, base, path string, want *use) (*use, error) {
	for {
		m.mu.Lock()
		if o := m.ops[name]; o != nil {
			o.waiters++
			m.mu.Unlock()
			err := wait(ctx, o.done)
			m.mu.Lock()
			o.waiters--
			m.mu.Unlock()
			if err != nil {
				return nil, err
			}
			if o.load && o.err != nil {
				return nil, o.err
			}
			continue // loaded or unloaded meanwhile: look again
		}
		st := m.eng.Stats()
		if slices.Contains(st.Adapters, name) {
			u := m.useLocked(name) // want, if any: an entry wanted is never dropped
			if want != nil {
				u.inUse++
				u.wanted--
			}
			m.touch(u)
			m.mu.Unlock()
			return u, nil
		}
		if path == "" {
			m.mu.Unlock()
			if base != "" {
				return nil, m.loadError(name, "", schemas.ErrAdapterNoPath.New(name))
			}
			return nil, nil
		}
		if base != "" && !slices.Contains(m.eng.Models(), base) {
			m.mu.Unlock()
			return nil, m.loadError(name, path, schemas.ErrAdapterBase.New(base))
		}
		victim, full := m.victimLocked(st)
		if full && victim == "" {
			// Every slot holds an adapter a request is running on: wait
			// for one to end.
			ch := m.changed
			m.waiting++
			m.mu.Unlock()
			err := wait(ctx, ch)
			m.mu.Lock()
			m.waiting--
			m.mu.Unlock()
			if err != nil {
				return nil, err
			}
			continue
		}
		o := m.beginLocked(name, true)
		var evict *op
		if victim != "" {
			evict = m.beginLocked(victim, false)
		}
		m.mu.Unlock()
		m.cfg.Changed() // dispatchers learn that the load is under way
		go m.run(name, path, o, victim, evict)
	}
}

// victimLocked reports whether the engine's slots are all taken (loaded
// adapters and loads in progress) and, if so, the loaded adapter to evict
// ("" if none): of those no request runs on or waits for and no operation
// touches, the one with the lowest request rate, the least recently used
// of equals. By rate, not recency: an adapter asked for steadily must not
// make way for a string of adapters each asked for once (a Zipf tail).
func (m *Manager) victimLocked(st engine.Stats) (victim string, full bool) {
	if st.MaxLoras <= 0 {
		return "", false
	}
	taken := len(st.Adapters)
	for name, o := range m.ops {
		if o.load && !slices.Contains(st.Adapters, name) {
			taken++
		}
	}
	if taken < st.MaxLoras {
		return "", false
	}
	now := m.cfg.Now()
	var coldest float64
	var oldest uint64
	for _, name := range st.Adapters {
		if m.ops[name] != nil {
			continue
		}
		// An adapter loaded behind our back counts as never asked for.
		var rate float64
		var last uint64
		if u := m.uses[name]; u != nil {
			if u.inUse > 0 || u.wanted > 0 {
				continue
			}
			rate, last = u.rate.Now(now, m.cfg.HalfLife), u.lastUse
		}
		if victim == "" || rate < coldest || rate == coldest && last < oldest {
			victim, coldest, oldest = name, rate, last
		}
	}
	return victim, true
}

// run evicts victim (if any), then loads name, and ends both operations.
func (m *Manager) run(name, path string, load *op, victim string, evict *op) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.LoadTimeout)
	defer cancel()
	if victim != "" {
		err := m.unloadEngine(ctx, victim)
		m.mu.Lock()
		if err == nil {
			m.forgetLocked(victim)
			m.evictions.Add(1)
		}
		m.endLocked(victim, evict, err)
		m.mu.Unlock()
		if err != nil {
			m.log.Warn("adapter not evicted", "adapter", victim, "err", err)
		} else {
			m.log.Info("adapter evicted", "adapter", victim, "for", name)
		}
	}
	start := time.Now()
	err := m.ad.LoadAdapter(ctx, name, path)
	if err != nil && slices.Contains(m.eng.Stats().Adapters, name) {
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
	m.endLocked(name, load, err)
	m.mu.Unlock()
	if err != nil {
		m.log.Warn("adapter load failed", "adapter", name, "path", path, "err", err)
	} else {
		m.log.Info("adapter loaded", "adapter", name, "path", path, "took", time.Since(start))
	}
	m.cfg.Changed()
}

// Unload unloads adapter name (for a control request: the registry dropped
// it): new requests for it wait, those running on it may finish for up to
// UnloadGrace (or until ctx ends), then it is unloaded whatever runs on it.
// An adapter the engine does not have is a success.
func (m *Manager) Unload(ctx context.Context, name string) error {
	if m.ad == nil {
		return schemas.ErrAdaptersUnsupported.New(m.eng.Name())
	}
	for {
		m.mu.Lock()
		if o := m.ops[name]; o != nil {
			m.mu.Unlock()
			if err := wait(ctx, o.done); err != nil {
				return err
			}
			continue
		}
		if !slices.Contains(m.eng.Stats().Adapters, name) {
			m.forgetLocked(name)
			m.mu.Unlock()
			return nil
		}
		o := m.beginLocked(name, false)
		m.mu.Unlock()

		m.drain(ctx, name)
		// The unload itself goes on when ctx ends: the adapter is half gone
		// already (requests for it wait), so finish the job, bounded.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.LoadTimeout)
		err := m.unloadEngine(uctx, name)
		cancel()
		m.mu.Lock()
		if err == nil {
			m.forgetLocked(name)
			m.unloads.Add(1)
		}
		m.endLocked(name, o, err)
		m.mu.Unlock()
		m.cfg.Changed()
		return err
	}
}

// drain waits until no request runs on adapter name, for at most the
// unload grace or until ctx ends.
func (m *Manager) drain(ctx context.Context, name string) {
	grace := time.NewTimer(m.cfg.UnloadGrace)
	defer grace.Stop()
	for {
		m.mu.Lock()
		busy := m.uses[name] != nil && m.uses[name].inUse > 0
		ch := m.changed
		m.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-ch:
		case <-grace.C:
			m.log.Warn("unloading an adapter requests still run on", "adapter", name)
			return
		case <-ctx.Done():
			return
		}
	}
}

// unloadEngine unloads from the engine; one it does not have is a success.
func (m *Manager) unloadEngine(ctx context.Context, name string) error {
	err := m.ad.UnloadAdapter(ctx, name)
	if err != nil && !slices.Contains(m.eng.Stats().Adapters, name) {
		var se *schemas.Error
		if errors.As(err, &se) && se.Status == http.StatusNotFound {
			return nil
		}
	}
	return err
}

// Loading lists the adapters being loaded, sorted.
func (m *Manager) Loading() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name, o := range m.ops {
		if o.load {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// InUse lists the adapters a request runs on or waits for, sorted, never
// nil: the manager evicts none of them.
func (m *Manager) InUse() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []string{}
	for name, u := range m.uses {
		if u.inUse > 0 || u.wanted > 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// forgetLocked drops adapter name's entry once it is unloaded, unless a
// request still runs on it (past an unload's grace) or waits for it: its
// entry must stay the one that request holds.
func (m *Manager) forgetLocked(name string) {
	if u := m.uses[name]; u != nil && u.inUse == 0 && u.wanted == 0 {
		delete(m.uses, name)
	}
}

func (m *Manager) useLocked(name string) *use {
	u := m.uses[name]
	if u == nil {
		u = &use{}
		m.uses[name] = u
	}
	return u
}

func (m *Manager) touch(u *use) {
	m.clock++
	u.lastUse = m.clock
}

func (m *Manager) beginLocked(name string, load bool) *op {
	o := &op{load: load, done: make(chan struct{})}
	m.ops[name] = o
	return o
}

func (m *Manager) endLocked(name string, o *op, err error) {
	if m.ops[name] == o {
		delete(m.ops, name)
	}
	o.err = err
	close(o.done)
	m.signalLocked()
}

func (m *Manager) signalLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func wait(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
