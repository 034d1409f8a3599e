package vllm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/lora"
)

// manager is the worker's adapter manager over e, as a worker makes it.
func manager(e *Engine) *lora.Manager { return lora.New(e, lora.Config{Worker: "w1"}) }

// generate runs one request for model as a worker does: its adapter
// acquired (loaded from path if vLLM lacks it) for as long as it runs.
func generate(ctx context.Context, m *lora.Manager, e *Engine, model, path, extra string, sink *recSink) error {
	release, err := m.Acquire(ctx, model, "", path)
	if err != nil {
		return err
	}
	defer release()
	_, err = e.Generate(ctx, request(model, extra), sink)
	return err
}

func TestModelsAndAdapters(t *testing.T) {
	f, srv := startFake(t)
	f.AddAdapter("sql", "/loras/sql")
	e := newEngine(t, fastConfig(srv.URL))
	testenv.WaitFor(t, 5*time.Second, func() error {
		if ms := e.Models(); !slices.Equal(ms, []string{"base", "sql"}) {
			return fmt.Errorf("models %v", ms)
		}
		return nil
	})
	if st := e.Stats(); !slices.Equal(st.Adapters, []string{"sql"}) {
		t.Errorf("adapters %v", st.Adapters)
	}
	// The engine's own unloads and loads show at once, without a refresh.
	if err := e.UnloadAdapter(t.Context(), "sql"); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(e.Models(), "sql") {
		t.Errorf("unloaded adapter still listed: %v", e.Models())
	}
	if err := e.LoadAdapter(t.Context(), "sql", "/loras/sql"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(e.Stats().Adapters, []string{"sql"}) {
		t.Errorf("loaded adapter not listed: %v", e.Stats().Adapters)
	}
	if got := f.Log(); !slices.Equal(got, []string{"unload sql", "load sql"}) {
		t.Errorf("vLLM saw %v", got)
	}
	// Loaded by someone else: picked up by the next refresh.
	f.AddAdapter("other", "/loras/other")
	wantStats(t, e, func(st engine.Stats) bool { return slices.Contains(st.Adapters, "other") })
}

// A /v1/models read that began before a load or unload ended does not undo it.
func TestStaleModelsRead(t *testing.T) {
	l := loaded{names: map[string]struct{}{}}
	v := l.version() // a read begins
	l.begin()
	l.end("x", true, true) // a load ends meanwhile
	l.sync(map[string]struct{}{}, v)
	if got := l.list(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("a stale read undid a load: %v", got)
	}
	v = l.version()
	l.begin() // an unload under way
	l.sync(map[string]struct{}{"x": {}, "y": {}}, v)
	l.end("x", true, false)
	if got := l.list(); len(got) != 0 {
		t.Fatalf("a read during an unload was taken: %v", got)
	}
	// A read with nothing local in between is the truth.
	v = l.version()
	l.sync(map[string]struct{}{"y": {}}, v)
	if got := l.list(); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("a fresh read was ignored: %v", got)
	}
}

// At MaxLoras the worker's manager unloads the adapter asked for least (by
// its decayed request rate; a control load is no request) before the next
// load.
func TestEviction(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.MaxLoras = 2
	e := newEngine(t, cfg)
	m := manager(e)
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.Load(ctx, "a", "", "/l/a"))
	must(m.Load(ctx, "b", "", "/l/b"))
	must(generate(ctx, m, e, "a", "/l/a", "", &recSink{}))
	must(generate(ctx, m, e, "a", "/l/a", "", &recSink{})) // a asked for twice, b never
	must(m.Load(ctx, "c", "", "/l/c"))                     // evicts b
	if got := e.Stats().Adapters; !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("adapters %v", got)
	}
	must(generate(ctx, m, e, "b", "/l/b", "", &recSink{})) // b on demand: evicts c, never asked for
	must(m.Load(ctx, "a", "", "/l/a"))                     // already loaded: no upstream call
	must(m.Load(ctx, "d", "", "/l/d"))                     // evicts b, asked for once (a twice)
	want := []string{"load a", "load b", "unload b", "load c", "unload c", "load b", "unload b", "load d"}
	if got := f.Log(); !slices.Equal(got, want) {
		t.Errorf("vLLM saw\n%v\nwant\n%v", got, want)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"a", "d"}) {
		t.Errorf("vLLM has %v loaded", got)
	}
	if got := e.Stats().Adapters; !slices.Equal(got, []string{"a", "d"}) {
		t.Errorf("adapters %v", got)
	}
}

// Concurrent loads and requests for one unloaded adapter make one upstream
// load, and one acquire per request (the engine acquires nothing itself).
func TestCoalescedLoads(t *testing.T) {
	f, srv := startFake(t)
	f.LoadDelay = 100 * time.Millisecond
	e := newEngine(t, fastConfig(srv.URL))
	m := manager(e)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 20 {
		wg.Go(func() { errs <- m.Load(t.Context(), "x", "", "/l/x") })
		wg.Go(func() { errs <- generate(t.Context(), m, e, "x", "/l/x", "", &recSink{}) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.Loads.Load(); n != 1 {
		t.Errorf("%d upstream loads, want 1", n)
	}
	if f.Requests() != 20 {
		t.Errorf("%d requests reached vLLM", f.Requests())
	}
}

func TestFailedLoads(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	m := manager(e)
	ctx := t.Context()

	// The engine passes vLLM's answer on, naming the adapter.
	se := asError(t, e.LoadAdapter(ctx, "m", "/l/missing"), 404)
	if !strings.Contains(se.Body.Message, "adapter m: Loading lora m failed: No adapter found") || se.Body.Type != "invalid_request_error" {
		t.Errorf("%v", se)
	}
	asError(t, e.LoadAdapter(ctx, "nopath", ""), 400)
	// A request gets the manager's adapter_load_failed, a 500: vLLM refused
	// the weights, a retry will not help. It never reaches vLLM.
	se = asError(t, generate(ctx, m, e, "broken", "/l/bad-rank", "", &recSink{}), 500)
	if se.Body.Code == nil || *se.Body.Code != schemas.CodeAdapterLoadFailed || !strings.Contains(se.Body.Message, "max_lora_rank") {
		t.Errorf("%v", se)
	}
	if f.Requests() != 0 {
		t.Errorf("a request went on after its adapter failed to load")
	}

	// vLLM already has it (loaded behind our back): a success.
	f.AddAdapter("there", "/l/there")
	if err := e.LoadAdapter(ctx, "there", "/l/there"); err != nil {
		t.Errorf("already loaded: %v", err)
	}
	// Unloading what vLLM does not have: a success.
	if err := e.UnloadAdapter(ctx, "never"); err != nil {
		t.Errorf("unload unknown: %v", err)
	}
	// The failed loads left nothing behind.
	if got := e.Stats().Adapters; !slices.Equal(got, []string{"there"}) {
		t.Errorf("adapters %v", got)
	}
}

// TestLoadAnswers maps vLLM 0.33.0's answers to /v1/load_lora_adapter (as
// internal/fakevllm gives them) to the engine's error, and to what a request
// for the adapter gets from the adapter manager.
func TestLoadAnswers(t *testing.T) {
	cases := []struct {
		name, adapter, path string
		status              int // the engine's; 0: a success
		reqStatus           int // a request's, from the manager
		msg                 string
	}{
		{"refused: rank too large (vLLM's 500)", "big", "/l/bad-rank", 422, 500, "max_lora_rank"},
		{"no weights at the path (vLLM's 404)", "gone", "/l/missing", 404, 500, "No adapter found"},
		{"engine core dead (vLLM's 500)", "d", "/l/dead", 500, 503, "EngineCore encountered an issue"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := startFake(t)
			e := newEngine(t, fastConfig(srv.URL))
			se := asError(t, e.LoadAdapter(t.Context(), tc.adapter, tc.path), tc.status)
			if !strings.Contains(se.Body.Message, tc.msg) {
				t.Errorf("engine: %v", se)
			}
			se = asError(t, generate(t.Context(), manager(e), e, tc.adapter+"-req", tc.path, "", &recSink{}), tc.reqStatus)
			if se.Body.Code == nil || *se.Body.Code != schemas.CodeAdapterLoadFailed || !strings.Contains(se.Body.Message, tc.msg) {
				t.Errorf("request: %v", se)
			}
			if got := e.Stats().Adapters; len(got) != 0 {
				t.Errorf("adapters %v after failed loads", got)
			}
		})
	}
}

// Only vLLM's "has already been loaded" is a success, not any 400 that
// mentions "already" (the message names the adapter).
func TestLoadAlreadyInName(t *testing.T) {
	f, srv := startFake(t)
	f.Base = []string{"base", "already-tuned"}
	e := newEngine(t, fastConfig(srv.URL))
	se := asError(t, e.LoadAdapter(t.Context(), "already-tuned", "/l/x"), 400)
	if !strings.Contains(se.Body.Message, "conflicts with a served base model") {
		t.Errorf("%v", se)
	}
	if got := e.Stats().Adapters; len(got) != 0 {
		t.Errorf("adapters %v", got)
	}
}

func TestNoRuntimeLoRAAPI(t *testing.T) {
	f, srv := startFake(t)
	f.NoLoRAAPI = true
	e := newEngine(t, fastConfig(srv.URL))
	se := asError(t, e.LoadAdapter(t.Context(), "x", "/l/x"), 404)
	if se.Body.Code == nil || *se.Body.Code != "lora_api_disabled" || !strings.Contains(se.Body.Message, "VLLM_ALLOW_RUNTIME_LORA_UPDATING") {
		t.Errorf("%v", se)
	}
	asError(t, e.UnloadAdapter(t.Context(), "x"), 404)
	// For a request that is a 500 adapter_load_failed saying so.
	se = asError(t, generate(t.Context(), manager(e), e, "x", "/l/x", "", &recSink{}), 500)
	if !strings.Contains(se.Body.Message, "VLLM_ALLOW_RUNTIME_LORA_UPDATING") {
		t.Errorf("%v", se)
	}
}

func TestLoadWhileDown(t *testing.T) {
	_, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	srv.Close()
	se := asError(t, e.LoadAdapter(t.Context(), "x", "/l/x"), 503)
	if se.Body.Code == nil || *se.Body.Code != "engine_unhealthy" {
		t.Errorf("%v", se)
	}
}

// An upstream call ends with its context, and with Close.
func TestLoadBoundedByContext(t *testing.T) {
	f, srv := startFake(t)
	f.LoadDelay = 5 * time.Second
	e := newEngine(t, fastConfig(srv.URL))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	se := asError(t, e.LoadAdapter(ctx, "x", "/l/x"), 504)
	if !strings.Contains(se.Body.Message, "did not answer") {
		t.Errorf("%v", se)
	}
	done := make(chan error, 1)
	go func() { done <- e.LoadAdapter(t.Context(), "y", "/l/y") }()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := f.Loads.Load(); n != 2 {
			return fmt.Errorf("%d loads reached vLLM, want the second", n)
		}
		return nil
	})
	e.Close()
	select {
	case err := <-done:
		if se := asError(t, err, 503); se.Body.Code == nil || *se.Body.Code != schemas.CodeShuttingDown {
			t.Errorf("%v", se)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not end a load in progress")
	}
}

// An adapter with a request running on it is not evicted: with every slot
// in use a load waits (the cap holds), and goes on once the request ends.
func TestInUseNotEvicted(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.MaxLoras = 1
	e := newEngine(t, cfg)
	m := manager(e)
	ctx, cancel := context.WithCancel(t.Context())
	sink := &recSink{}
	done := make(chan struct{})
	go func() { generate(ctx, m, e, "a", "/l/a", `,"x_fake":{"mode":"slow"}`, sink); close(done) }()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if len(sink.Lines()) != 1 {
			return errors.New("the request on a never started")
		}
		return nil
	})
	short, stop := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer stop()
	if err := m.Load(short, "b", "", "/l/b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("load into slots all in use: %v, want it to wait", err)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("vLLM has %v", got)
	}
	loaded := make(chan error, 1)
	go func() { loaded <- m.Load(t.Context(), "b", "", "/l/b") }()
	cancel()
	<-done
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("vLLM has %v, want a evicted for b", got)
	}
}

// A requester that gives up while waiting for a load does not cancel the
// load for the others.
func TestLoadOutlivesCaller(t *testing.T) {
	f, srv := startFake(t)
	f.LoadDelay = 200 * time.Millisecond
	e := newEngine(t, fastConfig(srv.URL))
	m := manager(e)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := m.Load(ctx, "x", "", "/l/x"); err == nil {
		t.Fatal("a load of 200ms finished within 20ms")
	}
	if err := m.Load(t.Context(), "x", "", "/l/x"); err != nil {
		t.Fatal(err)
	}
	if n := f.Loads.Load(); n != 1 {
		t.Errorf("%d upstream loads", n)
	}
}

// A request for an adapter vLLM lacks loads it, then runs, its body
// untouched; the next one loads nothing.
func TestOnDemandLoad(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	m := manager(e)
	if slices.Contains(e.Models(), "sql") {
		t.Fatal("sql listed before it was loaded")
	}
	release, err := m.Acquire(t.Context(), "sql", "", "/loras/sql")
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	req := request("sql", "")
	if _, err := e.Generate(t.Context(), req, sink); err != nil {
		t.Fatal(err)
	}
	release()
	if len(sink.Lines()) != 4 || !slices.Equal(f.Loaded(), []string{"sql"}) || !slices.Contains(e.Models(), "sql") {
		t.Errorf("%d chunks; vLLM has %v; models %v", len(sink.Lines()), f.Loaded(), e.Models())
	}
	if string(f.Body(req.ID)) != string(req.Body) {
		t.Errorf("body changed")
	}
	if err := generate(t.Context(), m, e, "sql", "/loras/sql", "", &recSink{}); err != nil || f.Loads.Load() != 1 {
		t.Errorf("%v; %d loads", err, f.Loads.Load())
	}
	// Without the dispatcher's path the engine loads nothing by itself:
	// vLLM answers for a name it does not serve.
	_, err = e.Generate(t.Context(), request("unknown-lora", ""), &recSink{})
	asError(t, err, 404)
	if f.Loads.Load() != 1 {
		t.Errorf("%d loads", f.Loads.Load())
	}
}
