package lora

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/decay"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func TestPassThrough(t *testing.T) {
	f := newFake(2)
	m, b := newManager(t, f, Config{})
	// A base model, or a name nothing says is an adapter: the engine answers.
	for _, model := range []string{"b", "unknown"} {
		release, err := m.Acquire(t.Context(), model, "", "")
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		release()
	}
	if len(f.ops()) != 0 || len(b.all()) != 0 {
		t.Fatalf("engine asked %v, beats %v", f.ops(), b.all())
	}
}

// Concurrent requests and control loads for one adapter make one load, and
// all of them get it.
func TestCoalescedLoad(t *testing.T) {
	f := newFake(2)
	f.gate = make(chan struct{})
	m, _ := newManager(t, f, Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 15)
	releases := make(chan func(), 10)
	for range 10 {
		wg.Go(func() {
			release, err := m.Acquire(t.Context(), "x", "b", "/x")
			errs <- err
			if err == nil {
				releases <- release
			}
		})
	}
	for range 5 {
		wg.Go(func() { errs <- m.Load(t.Context(), "x", "b", "/x") })
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := m.opWaiters("x"); n != 15 {
			return fmt.Errorf("%d callers wait for the load of x", n)
		}
		return nil
	})
	close(f.gate)
	wg.Wait()
	close(errs)
	close(releases)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := f.ops(); !slices.Equal(got, []string{"load x"}) {
		t.Fatalf("engine asked %v, want one load", got)
	}
	if s := m.Stats(); s != (Stats{Loads: 1}) {
		t.Fatalf("%+v", s)
	}
	m.mu.Lock()
	inUse := m.uses["x"].inUse
	m.mu.Unlock()
	if inUse != 10 {
		t.Fatalf("%d uses, want 10 (control loads are not uses)", inUse)
	}
	for release := range releases {
		release()
	}
}

// clock is a settable clock for the managers' request rates.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1e9, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestEviction: with the slots full, the adapter with the lowest decayed
// request rate goes, the least recently used of equals; never one a request
// runs on. Two slots, a 10 s half-life, a clock that moves only when told.
func TestEviction(t *testing.T) {
	type step struct {
		after   time.Duration // the clock moves this much first
		adapter string
		hold    bool // the request keeps running to the end of the test
	}
	seq := func(names ...string) []step {
		out := make([]step, len(names))
		for i, n := range names {
			out[i] = step{adapter: n}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		behind []string // loaded on the engine before the manager starts
		steps  []step   // requests, in order
		want   []string // what the engine was asked
		loaded []string
	}{
		{"the coldest goes", nil, seq("x", "y", "x", "z"),
			[]string{"load x", "load y", "unload y", "load z"}, []string{"x", "z"}},
		{"hot stays while one-offs take turns (LRU would evict x)", nil, seq("x", "x", "x", "y", "z", "w"),
			[]string{"load x", "load y", "unload y", "load z", "unload z", "load w"}, []string{"w", "x"}},
		{"it comes back, evicting the colder (LRU: the older)", nil, seq("x", "y", "x", "z", "y"),
			[]string{"load x", "load y", "unload y", "load z", "unload z", "load y"}, []string{"x", "y"}},
		{"equal rates: the least recently used", nil, seq("x", "y", "z"),
			[]string{"load x", "load y", "unload x", "load z"}, []string{"y", "z"}},
		{"rates decay: three requests a minute ago are colder than one now", nil,
			[]step{{0, "x", false}, {0, "x", false}, {0, "x", false}, {time.Minute, "y", false}, {0, "z", false}},
			[]string{"load x", "load y", "unload x", "load z"}, []string{"y", "z"}},
		{"within a half-life they are not", nil,
			[]step{{0, "x", false}, {0, "x", false}, {0, "x", false}, {5 * time.Second, "y", false}, {0, "z", false}},
			[]string{"load x", "load y", "unload y", "load z"}, []string{"x", "z"}},
		{"a running request pins the colder", nil,
			[]step{{0, "x", false}, {0, "x", false}, {0, "x", false}, {0, "y", true}, {0, "z", false}},
			[]string{"load x", "load y", "unload x", "load z"}, []string{"y", "z"}},
		{"loaded behind our back counts as never asked for", []string{"ext"}, seq("x", "y"),
			[]string{"load x", "unload ext", "load y"}, []string{"x", "y"}},
		{"room left: no eviction", nil, seq("x", "y", "x", "y"),
			[]string{"load x", "load y"}, []string{"x", "y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(2)
			for _, a := range tc.behind {
				f.add(a)
			}
			c := newClock()
			m, _ := newManager(t, f, Config{Now: c.Now})
			for _, st := range tc.steps {
				c.advance(st.after)
				release, err := m.Acquire(t.Context(), st.adapter, "b", "/"+st.adapter)
				if err != nil {
					t.Fatalf("acquire %s: %v", st.adapter, err)
				}
				if st.hold {
					defer release()
				} else {
					release()
				}
			}
			if got := f.ops(); !slices.Equal(got, tc.want) {
				t.Errorf("engine asked %v, want %v", got, tc.want)
			}
			if got := f.Stats().Adapters; !slices.Equal(got, tc.loaded) {
				t.Errorf("loaded %v, want %v", got, tc.loaded)
			}
		})
	}
}

// TestVictim tables the eviction choice itself, with what requests cannot
// show in sequence: an adapter a request waits for (its load just ended)
// is pinned like one a request runs on, and so is one an operation holds.
func TestVictim(t *testing.T) {
	now := time.Unix(1e9, 0)
	type u struct {
		rate          float64
		ago           time.Duration // when rate was measured
		last          uint64
		inUse, wanted int
	}
	for _, tc := range []struct {
		name   string
		uses   map[string]u
		ops    []string // adapters with an operation in progress
		victim string
	}{
		{"lowest rate", map[string]u{"x": {rate: 2, last: 1}, "y": {rate: 0.5, last: 2}}, nil, "y"},
		{"rates compared at now", map[string]u{"x": {rate: 2, ago: 30 * time.Second, last: 1}, "y": {rate: 0.5, last: 2}}, nil, "x"},
		{"equal rates: least recently used", map[string]u{"x": {rate: 1, last: 2}, "y": {rate: 1, last: 1}}, nil, "y"},
		{"running pins", map[string]u{"x": {rate: 2, last: 1}, "y": {rate: 0.5, last: 2, inUse: 1}}, nil, "x"},
		{"waited for pins", map[string]u{"x": {rate: 2, last: 1}, "y": {rate: 0.5, last: 2, wanted: 1}}, nil, "x"},
		{"an operation pins", map[string]u{"x": {rate: 2, last: 1}, "y": {rate: 0.5, last: 2}}, []string{"y"}, "x"},
		{"no entry: never asked for", map[string]u{"x": {rate: 0.01, last: 1}}, nil, "y"},
		{"all pinned: none", map[string]u{"x": {inUse: 1}, "y": {wanted: 2}}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(2)
			f.add("x")
			f.add("y")
			m, _ := newManager(t, f, Config{Now: func() time.Time { return now }})
			for name, x := range tc.uses {
				m.uses[name] = &use{rate: decay.Rate{V: x.rate, At: now.Add(-x.ago)}, lastUse: x.last, inUse: x.inUse, wanted: x.wanted}
			}
			for _, name := range tc.ops {
				m.beginLocked(name, false)
			}
			victim, full := m.victimLocked(f.Stats())
			if !full || victim != tc.victim {
				t.Fatalf("victim %q (full %v), want %q", victim, full, tc.victim)
			}
		})
	}
}

// A control load into full slots evicts too; one of an adapter already
// loaded loads nothing; one without a path is refused.
func TestControlLoad(t *testing.T) {
	f := newFake(1)
	m, _ := newManager(t, f, Config{})
	ctx := t.Context()
	for _, name := range []string{"x", "x", "y"} {
		if err := m.Load(ctx, name, "b", "/"+name); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.ops(); !slices.Equal(got, []string{"load x", "unload x", "load y"}) {
		t.Fatalf("engine asked %v", got)
	}
	if s := m.Stats(); s != (Stats{Loads: 2, Evictions: 1}) {
		t.Fatalf("%+v", s)
	}
	var se *schemas.Error
	if err := m.Load(ctx, "z", "b", ""); !errors.As(err, &se) || se.Status != 400 {
		t.Fatalf("load without a path: %v", err)
	}
}

// With every slot held by an adapter a request runs on, a request for
// another adapter waits (the cap holds), and goes on once one is free.
func TestWaitsWhenFull(t *testing.T) {
	f := newFake(1)
	m, _ := newManager(t, f, Config{})
	releaseX, err := m.Acquire(t.Context(), "x", "b", "/x")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		release, err := m.Acquire(t.Context(), "y", "b", "/y")
		if err == nil {
			release()
		}
		done <- err
	}()
	// A second waiter gives up: it gets its context's error, nothing changes.
	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)
	go func() { _, err := m.Acquire(ctx, "z", "b", "/z"); gaveUp <- err }()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := m.waiters(); n != 2 {
			return fmt.Errorf("%d waiting for a slot", n)
		}
		return nil
	})
	// In use (no victims, and what heartbeats say): the one running and the
	// ones waiting.
	if got := m.InUse(); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("in use %v, want x running and y, z waiting", got)
	}
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter that gave up got %v", err)
	}
	if got := m.InUse(); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("in use %v after z gave up", got)
	}
	if got := f.ops(); !slices.Equal(got, []string{"load x"}) {
		t.Fatalf("while x is in use the engine was asked %v", got)
	}
	releaseX()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.ops(); !slices.Equal(got, []string{"load x", "unload x", "load y"}) {
		t.Fatalf("engine asked %v", got)
	}
	if f.maxLoaded() != 1 {
		t.Fatalf("%d adapters loaded at once with one slot", f.maxLoaded())
	}
	if got := m.InUse(); got == nil || len(got) != 0 {
		t.Fatalf("in use %#v once every request ended, want an empty list", got)
	}
}

func TestLoadFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error // the engine's
		status int   // what the request gets
		msg    string
	}{
		{"refused: no weights", schemas.FromUpstream(400, schemas.TypeInvalidRequest, "", "lora_path", "No adapter found for /x"), 500, "No adapter found"},
		{"refused: not found", schemas.ErrModelNotFound.New("x"), 500, "does not exist"},
		{"engine down", schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeEngineUnhealthy, "", "vllm is unreachable").WithRetryAfter(1), 503, "unreachable"},
		{"engine overloaded", schemas.FromUpstream(429, schemas.TypeOverloaded, "", "", "too many"), 503, "too many"},
		{"engine slow", schemas.FromUpstream(504, schemas.TypeTimeout, "timeout", "", "vLLM did not answer"), 503, "did not answer"},
		{"not an API error", errors.New("disk on fire"), 503, "disk on fire"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(2)
			f.fail["/x"] = tc.err
			f.gate = make(chan struct{})
			m, _ := newManager(t, f, Config{})
			// Three requests share the one failed load (the first waits for the
			// load it started, as the others do).
			errs := make(chan error, 3)
			for range 3 {
				go func() { _, err := m.Acquire(t.Context(), "x", "b", "/x"); errs <- err }()
			}
			testenv.WaitFor(t, 2*time.Second, func() error {
				if n := m.opWaiters("x"); n != 3 {
					return fmt.Errorf("%d requests wait for the load of x", n)
				}
				return nil
			})
			close(f.gate)
			for range 3 {
				var se *schemas.Error
				err := <-errs
				if !errors.As(err, &se) || se.Status != tc.status || se.Body.Code == nil || *se.Body.Code != schemas.CodeAdapterLoadFailed ||
					!strings.Contains(se.Body.Message, "`x` from `/x` on worker w1") || !strings.Contains(se.Body.Message, tc.msg) {
					t.Fatalf("got %v", err)
				}
				if (se.RetryAfter > 0) != (tc.status == 503) {
					t.Errorf("retry after %d with status %d", se.RetryAfter, se.Status)
				}
			}
			if got := f.ops(); !slices.Equal(got, []string{"load x"}) {
				t.Errorf("engine asked %v", got)
			}
			if s := m.Stats(); s != (Stats{LoadFailures: 1}) {
				t.Errorf("%+v", s)
			}
			// The failure is not remembered: a good path loads.
			delete(f.fail, "/x")
			run1(t, m, "x", "/x")
		})
	}
}

// A load that takes longer than LoadTimeout fails with a 503 to retry.
func TestLoadTimeout(t *testing.T) {
	f := newFake(2)
	f.gate = make(chan struct{}) // never opened
	m, _ := newManager(t, f, Config{LoadTimeout: 20 * time.Millisecond})
	_, err := m.Acquire(t.Context(), "x", "b", "/x")
	var se *schemas.Error
	if !errors.As(err, &se) || se.Status != 503 || *se.Body.Code != schemas.CodeAdapterLoadFailed {
		t.Fatalf("got %v", err)
	}
}

func TestRequestErrors(t *testing.T) {
	f := newFake(2)
	m, _ := newManager(t, f, Config{})
	for _, tc := range []struct {
		name, model, base, path string
		msg                     string
	}{
		{"registered without a path", "x", "b", "", "no path"},
		{"base model not served", "x", "other", "/x", "base model `other`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Acquire(t.Context(), tc.model, tc.base, tc.path)
			var se *schemas.Error
			if !errors.As(err, &se) || se.Body.Code == nil || *se.Body.Code != schemas.CodeAdapterLoadFailed || !strings.Contains(se.Body.Message, tc.msg) {
				t.Fatalf("got %v", err)
			}
		})
	}
	if len(f.ops()) != 0 {
		t.Fatalf("engine asked %v", f.ops())
	}
}

// An engine without engine.Adapters serves the adapters it has by itself;
// any other gets adapter_load_failed, and control operations a 400.
func TestEngineWithoutAdapters(t *testing.T) {
	f := newFake(2)
	f.base = []string{"b", "served-lora"}
	m, _ := newManager(t, noAdapters{f}, Config{})
	if m.CanLoad() {
		t.Fatal("CanLoad")
	}
	release, err := m.Acquire(t.Context(), "served-lora", "b", "/x")
	if err != nil {
		t.Fatal(err)
	}
	release()
	_, err = m.Acquire(t.Context(), "x", "b", "/x")
	var se *schemas.Error
	if !errors.As(err, &se) || se.Status != 500 || *se.Body.Code != schemas.CodeAdapterLoadFailed || !strings.Contains(se.Body.Message, "cannot load") {
		t.Fatalf("got %v", err)
	}
	if err := m.Load(t.Context(), "x", "b", "/x"); !errors.As(err, &se) || se.Status != 400 {
		t.Fatalf("load: %v", err)
	}
	if err := m.Unload(t.Context(), "x"); !errors.As(err, &se) || se.Status != 400 {
		t.Fatalf("unload: %v", err)
	}
}

// An unload waits for the requests running on the adapter (holding new ones
// back), within the grace period.
func TestUnloadWaitsForRequests(t *testing.T) {
	f := newFake(2)
	m, _ := newManager(t, f, Config{UnloadGrace: time.Minute})
	release, err := m.Acquire(t.Context(), "x", "b", "/x")
	if err != nil {
		t.Fatal(err)
	}
	unloaded := make(chan error, 1)
	go func() { unloaded <- m.Unload(t.Context(), "x") }()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if !m.unloading("x") {
			return errors.New("no unload under way")
		}
		return nil
	})
	// A new request for x waits for the unload, then loads x again.
	again := make(chan error, 1)
	go func() {
		r, err := m.Acquire(t.Context(), "x", "b", "/x")
		if err == nil {
			r()
		}
		again <- err
	}()
	if got := f.ops(); !slices.Equal(got, []string{"load x"}) {
		t.Fatalf("unloaded while a request runs on it: %v", got)
	}
	release()
	if err := <-unloaded; err != nil {
		t.Fatal(err)
	}
	if err := <-again; err != nil {
		t.Fatal(err)
	}
	if got := f.ops(); !slices.Equal(got, []string{"load x", "unload x", "load x"}) {
		t.Fatalf("engine asked %v", got)
	}
	if s := m.Stats(); s != (Stats{Loads: 2, Unloads: 1}) {
		t.Fatalf("%+v", s)
	}
}

func TestUnload(t *testing.T) {
	t.Run("grace over: unloaded under a running request", func(t *testing.T) {
		f := newFake(2)
		m, _ := newManager(t, f, Config{UnloadGrace: 20 * time.Millisecond})
		release, err := m.Acquire(t.Context(), "x", "b", "/x")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Unload(t.Context(), "x"); err != nil {
			t.Fatal(err)
		}
		if got := f.Stats().Adapters; len(got) != 0 {
			t.Fatalf("loaded %v", got)
		}
		release() // the request ends after: nothing to undo
		if s := m.Stats(); s != (Stats{Loads: 1, Unloads: 1}) {
			t.Fatalf("%+v", s)
		}
	})
	t.Run("its context over: unloaded at once", func(t *testing.T) {
		f := newFake(2)
		m, _ := newManager(t, f, Config{UnloadGrace: time.Hour})
		release, err := m.Acquire(t.Context(), "x", "b", "/x")
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := m.Unload(ctx, "x"); err != nil {
			t.Fatal(err)
		}
		if got := f.ops(); !slices.Equal(got, []string{"load x", "unload x"}) {
			t.Fatalf("engine asked %v", got)
		}
	})
	t.Run("not loaded: a success, nothing asked", func(t *testing.T) {
		f := newFake(2)
		m, _ := newManager(t, f, Config{})
		if err := m.Unload(t.Context(), "x"); err != nil {
			t.Fatal(err)
		}
		if len(f.ops()) != 0 {
			t.Fatalf("engine asked %v", f.ops())
		}
	})
}

// A load runs on when the request that started it gives up; the next
// request finds it loaded.
func TestLoadOutlivesFirstRequester(t *testing.T) {
	f := newFake(2)
	f.gate = make(chan struct{})
	m, _ := newManager(t, f, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() { _, err := m.Acquire(ctx, "x", "b", "/x"); first <- err }()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if !slices.Equal(m.Loading(), []string{"x"}) {
			return errors.New("no load yet")
		}
		return nil
	})
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first requester: %v", err)
	}
	if !slices.Equal(m.Loading(), []string{"x"}) {
		t.Fatalf("the load ended with its first requester: loading %v", m.Loading())
	}
	close(f.gate)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if s := m.Stats(); s.Loads != 1 {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	run1(t, m, "x", "/x")
	if got := f.ops(); !slices.Equal(got, []string{"load x"}) {
		t.Fatalf("engine asked %v", got)
	}
}

// Changed is called when a load starts (Loading lists the adapter), when it
// ends (the engine lists it) and when an adapter is unloaded.
func TestChangedOnLoadAndUnload(t *testing.T) {
	f := newFake(1)
	m, b := newManager(t, f, Config{})
	// A load's end is reported from the goroutine that ran it, after its
	// waiters were let go: wait for each step's beats before the next step,
	// or one step's report reads the next one's state.
	beats := func(n int) {
		t.Helper()
		testenv.WaitFor(t, 5*time.Second, func() error {
			if got := len(b.all()); got < n {
				return fmt.Errorf("%d beats, want %d", got, n)
			}
			return nil
		})
	}
	run1(t, m, "x", "/x")
	beats(2)
	run1(t, m, "x", "/x") // loaded: no beat
	run1(t, m, "y", "/y") // evicts x
	beats(4)
	if err := m.Unload(t.Context(), "y"); err != nil {
		t.Fatal(err)
	}
	beats(5)
	want := []beat{
		{loading: []string{"x"}, adapters: []string{}},
		{loading: nil, adapters: []string{"x"}},
		{loading: []string{"y"}, adapters: []string{"x"}},
		{loading: nil, adapters: []string{"y"}},
		{loading: nil, adapters: []string{}},
	}
	got := b.all()
	if len(got) != len(want) {
		t.Fatalf("beats %+v, want %+v", got, want)
	}
	for i := range want {
		if !slices.Equal(got[i].loading, want[i].loading) || !slices.Equal(got[i].adapters, want[i].adapters) {
			t.Fatalf("beat %d: %+v, want %+v (all: %+v)", i, got[i], want[i], got)
		}
	}
}
