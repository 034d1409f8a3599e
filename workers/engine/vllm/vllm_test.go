package vllm

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/workers/engine"
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
	wantStats(t, e, func(st engine.Stats) bool {
		return st.Running == 3 && st.Waiting == 2 && st.KVCacheUsage == 0.25 && st.MaxLoras == 4
	})

	f.SetMetrics("vllm:num_requests_running 0\nvllm:num_requests_waiting 7\nvllm:gpu_cache_usage_perc 0.5\n")
	wantStats(t, e, func(st engine.Stats) bool {
		return st.Running == 0 && st.Waiting == 7 && st.KVCacheUsage == 0.5 && st.MaxLoras == 0
	})

	// The engine's own requests count when vLLM's figure lags behind.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 2 {
		go e.Generate(ctx, request("base", `,"x_fake":{"mode":"slow"}`), &recSink{})
	}
	wantStats(t, e, func(st engine.Stats) bool { return st.Running == 2 })
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
