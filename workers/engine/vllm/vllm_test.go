package vllm

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine/internal/fakevllm"
)

func TestParseMetrics(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
		want Metrics
		err  bool
	}{
		{"vLLM 0.10", fakevllm.DefaultMetrics,
			Metrics{Running: 3, Waiting: 2, KVCacheUsage: 0.25, MaxLora: 4, RunningAdapters: []string{"a", "b"}}, false},
		{"old kv-cache name", `# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_running{model_name="m"} 1
`, Metrics{Running: 1, KVCacheUsage: 0.5}, false},
		{"new name wins over the old", `vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:kv_cache_usage_perc{model_name="m"} 0.1
`, Metrics{KVCacheUsage: 0.1}, false},
		{"summed over label sets, kv the largest", `# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
`, Metrics{Running: 7, Waiting: 5, KVCacheUsage: 0.7}, false},
		{"newest lora sample", `# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.0e+09
vllm:lora_requests_info{max_lora="8",running_lora_adapters="x, y",waiting_lora_adapters="z"} 1.7e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="older",waiting_lora_adapters=""} 0.9e+09
`, Metrics{MaxLora: 8, RunningAdapters: []string{"x", "y"}, WaitingAdapters: []string{"z"}}, false},
		{"no vLLM metrics", "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n", Metrics{}, false},
		{"lookalike names ignored", "vllm:num_requests_running_total 9\nvllm:num_requests_waiting_by_reason{reason=\"x\"} 9\n", Metrics{}, false},
		{"no final newline", "vllm:num_requests_running 4", Metrics{Running: 4}, false},
		{"broken", "vllm:num_requests_running{model_name=\"m\" 1\n", Metrics{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(tc.text))
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if got.Running != tc.want.Running || got.Waiting != tc.want.Waiting || got.KVCacheUsage != tc.want.KVCacheUsage ||
				got.MaxLora != tc.want.MaxLora || !slices.Equal(got.RunningAdapters, tc.want.RunningAdapters) ||
				!slices.Equal(got.WaitingAdapters, tc.want.WaitingAdapters) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestStats(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	eventually(t, 5*time.Second, func() bool {
		st := e.Stats()
		return st.Running == 3 && st.Waiting == 2 && st.KVCacheUsage == 0.25 && st.MaxLoras == 4
	}, "stats %+v", e.Stats())

	f.SetMetrics("vllm:num_requests_running 0\nvllm:num_requests_waiting 7\nvllm:gpu_cache_usage_perc 0.5\n")
	eventually(t, 5*time.Second, func() bool {
		st := e.Stats()
		return st.Running == 0 && st.Waiting == 7 && st.KVCacheUsage == 0.5 && st.MaxLoras == 0
	}, "stats %+v", e.Stats())

	// The engine's own requests count when vLLM's figure lags behind.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 2 {
		go e.Generate(ctx, request("base", `,"x_fake":{"mode":"slow"}`), &recSink{})
	}
	eventually(t, 5*time.Second, func() bool { return e.Stats().Running == 2 }, "stats %+v", e.Stats())
}

func TestModelsAndAdapters(t *testing.T) {
	f, srv := startFake(t)
	f.AddAdapter("sql", "/loras/sql")
	e := newEngine(t, fastConfig(srv.URL))
	eventually(t, 5*time.Second, func() bool { return slices.Equal(e.Models(), []string{"base", "sql"}) }, "models %v", e.Models())
	if st := e.Stats(); !slices.Equal(st.Adapters, []string{"sql"}) {
		t.Errorf("adapters %v", st.Adapters)
	}
	// Its path came with it (root): unloaded, it loads again on demand.
	if err := e.UnloadAdapter(t.Context(), "sql"); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(e.Models(), "sql") {
		t.Errorf("unloaded adapter still listed: %v", e.Models())
	}
	if _, err := e.Generate(t.Context(), request("sql", ""), &recSink{}); err != nil {
		t.Fatal(err)
	}
	if got := f.Log(); !slices.Equal(got, []string{"unload sql", "load sql"}) {
		t.Errorf("vLLM saw %v", got)
	}
	// Loaded by someone else: picked up by the next refresh.
	f.AddAdapter("other", "/loras/other")
	eventually(t, 5*time.Second, func() bool { return slices.Contains(e.Stats().Adapters, "other") }, "adapters %v", e.Stats().Adapters)
}

// At MaxLoras, the least recently used adapter (a request is a use, and so
// is a load) is unloaded before the next load.
func TestLRUEviction(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.MaxLoras = 2
	e := newEngine(t, cfg)
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.LoadAdapter(ctx, "a", "/l/a"))
	must(e.LoadAdapter(ctx, "b", "/l/b"))
	_, err := e.Generate(ctx, request("a", ""), &recSink{}) // a is now newer than b
	must(err)
	must(e.LoadAdapter(ctx, "c", "/l/c")) // evicts b
	if got := e.Stats().Adapters; !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("adapters %v", got)
	}
	_, err = e.Generate(ctx, request("b", ""), &recSink{}) // b on demand: evicts a
	must(err)
	must(e.LoadAdapter(ctx, "c", "")) // already loaded: a use, no upstream call
	must(e.LoadAdapter(ctx, "d", "/l/d"))
	want := []string{"load a", "load b", "unload b", "load c", "unload a", "load b", "unload b", "load d"}
	if got := f.Log(); !slices.Equal(got, want) {
		t.Errorf("vLLM saw\n%v\nwant\n%v", got, want)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"c", "d"}) {
		t.Errorf("vLLM has %v loaded", got)
	}
	if got := e.Stats().Adapters; !slices.Equal(got, []string{"c", "d"}) {
		t.Errorf("adapters %v", got)
	}
}

// Concurrent loads and requests for one unloaded adapter make one upstream load.
func TestCoalescedLoads(t *testing.T) {
	f, srv := startFake(t)
	f.LoadDelay = 100 * time.Millisecond
	cfg := fastConfig(srv.URL)
	cfg.KnownAdapters = map[string]string{"x": "/l/x"}
	e := newEngine(t, cfg)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 20 {
		wg.Go(func() { errs <- e.LoadAdapter(t.Context(), "x", "/l/x") })
		wg.Go(func() { _, err := e.Generate(t.Context(), request("x", ""), &recSink{}); errs <- err })
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
	cfg := fastConfig(srv.URL)
	cfg.KnownAdapters = map[string]string{"broken": "/l/bad-rank"}
	e := newEngine(t, cfg)
	ctx := t.Context()

	se := asError(t, e.LoadAdapter(ctx, "m", "/l/missing"), 404)
	if !strings.Contains(se.Body.Message, "adapter m: Loading lora m failed: No adapter found") || se.Body.Type != "invalid_request_error" {
		t.Errorf("%v", se)
	}
	_, err := e.Generate(ctx, request("broken", ""), &recSink{})
	se = asError(t, err, 400)
	if !strings.Contains(se.Body.Message, "max_lora_rank") {
		t.Errorf("%v", se)
	}
	if f.Requests() != 0 {
		t.Errorf("a request went on after its adapter failed to load")
	}
	asError(t, e.LoadAdapter(ctx, "nopath", ""), 400)

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

func TestNoRuntimeLoRAAPI(t *testing.T) {
	f, srv := startFake(t)
	f.NoLoRAAPI = true
	e := newEngine(t, fastConfig(srv.URL))
	se := asError(t, e.LoadAdapter(t.Context(), "x", "/l/x"), 404)
	if se.Body.Code == nil || *se.Body.Code != "lora_api_disabled" || !strings.Contains(se.Body.Message, "VLLM_ALLOW_RUNTIME_LORA_UPDATING") {
		t.Errorf("%v", se)
	}
	asError(t, e.UnloadAdapter(t.Context(), "x"), 404)
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

// An adapter with a request running on it is not evicted: the cap gives.
func TestInUseNotEvicted(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.MaxLoras = 1
	cfg.KnownAdapters = map[string]string{"a": "/l/a"}
	e := newEngine(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	sink := &recSink{}
	done := make(chan struct{})
	go func() { e.Generate(ctx, request("a", `,"x_fake":{"mode":"slow"}`), sink); close(done) }()
	eventually(t, 5*time.Second, func() bool { return sink.n() == 1 }, "request on a never started")
	if err := e.LoadAdapter(t.Context(), "b", "/l/b"); err != nil {
		t.Fatal(err)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("vLLM has %v", got)
	}
	cancel()
	<-done
	if err := e.LoadAdapter(t.Context(), "c", "/l/c"); err != nil {
		t.Fatal(err)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("vLLM has %v, want the cap back at 1", got)
	}
}

// A requester that gives up while waiting for a load does not cancel the
// load for the others.
func TestLoadOutlivesCaller(t *testing.T) {
	f, srv := startFake(t)
	f.LoadDelay = 200 * time.Millisecond
	e := newEngine(t, fastConfig(srv.URL))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := e.LoadAdapter(ctx, "x", "/l/x"); err == nil {
		t.Fatal("a load of 200ms finished within 20ms")
	}
	if err := e.LoadAdapter(t.Context(), "x", "/l/x"); err != nil {
		t.Fatal(err)
	}
	if n := f.Loads.Load(); n != 1 {
		t.Errorf("%d upstream loads", n)
	}
}

func TestDefaults(t *testing.T) {
	for _, tc := range []struct {
		cmd, url string
		loras    int
	}{
		{"", "http://127.0.0.1:8000", 0},
		{"vllm serve m --port 8123 --enable-lora --max-loras 4", "http://127.0.0.1:8123", 4},
		{"vllm serve m", "http://127.0.0.1:8000", 0},
	} {
		cfg := Config{}
		cfg.StopGrace = time.Millisecond
		cfg.Command = strings.Replace(tc.cmd, "vllm", "true", 1) // never starts a real vLLM
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if e.URL() != tc.url || e.Stats().MaxLoras != tc.loras || e.Name() != "vllm" {
			t.Errorf("%q: url %s max_loras %d", tc.cmd, e.URL(), e.Stats().MaxLoras)
		}
		e.Close()
	}
}

// A request for a known adapter that is not loaded loads it, then runs.
func TestOnDemandLoad(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.KnownAdapters = map[string]string{"sql": "/loras/sql"}
	e := newEngine(t, cfg)
	if slices.Contains(e.Models(), "sql") {
		t.Fatal("sql listed before it was loaded")
	}
	sink := &recSink{}
	req := request("sql", "")
	if _, err := e.Generate(t.Context(), req, sink); err != nil {
		t.Fatal(err)
	}
	if sink.n() != 3 || !slices.Equal(f.Loaded(), []string{"sql"}) || !slices.Contains(e.Models(), "sql") {
		t.Errorf("%d chunks; vLLM has %v; models %v", sink.n(), f.Loaded(), e.Models())
	}
	if string(f.Body(req.ID)) != string(req.Body) {
		t.Errorf("body changed")
	}
	// Loaded now: the next request loads nothing.
	if _, err := e.Generate(t.Context(), request("sql", ""), &recSink{}); err != nil || f.Loads.Load() != 1 {
		t.Errorf("%v; %d loads", err, f.Loads.Load())
	}
}
