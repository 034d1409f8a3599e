package integration

import (
	"net/http"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// After a request, /metrics (all components share it in dev) parses and has
// the gateway's, the dispatcher's and the worker's series.
func TestMetricsAfterARequest(t *testing.T) {
	d := startDev(t)
	checkStream(t, post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`), true, 1, false)
	resp, err := http.Get(d.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	want := map[string]bool{ // name: must be non-zero after the request (else: must exist)
		"tokenbus_gateway_requests_total":              true,
		"tokenbus_gateway_time_to_first_token_seconds": true,
		"tokenbus_dispatcher_routed_total":             true,
		"tokenbus_worker_requests_total":               true,
		"tokenbus_worker_time_to_first_token_seconds":  true,
		"tokenbus_worker_running":                      false,
		"tokenbus_worker_engine_healthy":               true,
		"tokenbus_gateway_active_streams":              false,
		"tokenbus_dispatcher_queue_wait_seconds":       false,
		"tokenbus_gateway_inter_token_latency_seconds": true,
		"tokenbus_worker_request_duration_seconds":     true,
		"tokenbus_worker_adapter_loads_total":          false,
		"tokenbus_dispatcher_bounces_total":            false,
		"tokenbus_gateway_output_chunks_total":         true,
		"tokenbus_gateway_request_duration_seconds":    true,
		"tokenbus_gateway_client_disconnects_total":    false,
		"tokenbus_worker_max_concurrency":              true,
		"tokenbus_worker_kv_cache_usage":               false,
		"tokenbus_worker_waiting":                      false,
		"tokenbus_worker_draining":                     false,
		"tokenbus_worker_adapter_evictions_total":      false,
		"tokenbus_worker_adapter_load_failures_total":  false,
	}
	for name, mustCount := range want {
		f, ok := families[name]
		if !ok {
			t.Errorf("metric %s missing", name)
			continue
		}
		if !mustCount {
			continue
		}
		sum := 0.0
		for _, m := range f.Metric {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
		if sum <= 0 {
			t.Errorf("metric %s is zero after a request", name)
		}
	}
}
