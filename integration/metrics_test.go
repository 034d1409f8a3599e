package integration

import (
	"net/http"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/program"
)

// After a request, /metrics (all components share it in dev) parses and has
// the gateway's, the dispatcher's and the worker's series.
func TestMetricsAfterARequest(t *testing.T) {
	t.Parallel()
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
		"tokenbus_gateway_tokens_total":                true,
		"tokenbus_dispatcher_queue_depth":              false,
		"tokenbus_dispatcher_workers":                  true,
		"tokenbus_dispatcher_running":                  false,
		"tokenbus_dispatcher_workers_joined_total":     true,
		"tokenbus_dispatcher_workers_lost_total":       false,
		"tokenbus_nats_connected":                      true,
		"tokenbus_nats_connection_restarts_total":      false,
		"tokenbus_redis_up":                            true,
		"tokenbus_auth_usage_pending":                  false,
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
	// The gateway's and the workers' latency histograms share their
	// buckets, so the two sides compare bucket for bucket.
	for _, pair := range [][2]string{
		{"tokenbus_gateway_time_to_first_token_seconds", "tokenbus_worker_time_to_first_token_seconds"},
		{"tokenbus_gateway_request_duration_seconds", "tokenbus_worker_request_duration_seconds"},
	} {
		if a, b := bounds(families[pair[0]]), bounds(families[pair[1]]); !slices.Equal(a, b) || len(a) < 20 {
			t.Errorf("buckets of %s %v and of %s %v", pair[0], a, pair[1], b)
		}
	}
	// Every model has its queue depth from the start, 0 when nothing waits.
	for _, m := range families["tokenbus_dispatcher_queue_depth"].Metric {
		if m.Gauge.GetValue() != 0 {
			t.Errorf("queue depth %v after the request finished", m)
		}
	}
	if n := len(families["tokenbus_dispatcher_queue_depth"].Metric); n != 2 { // llama-8b and its example adapter
		t.Errorf("%d queue_depth series, want 2", n)
	}
}

// bounds are the upper bounds of the first histogram of f.
func bounds(f *dto.MetricFamily) []float64 {
	if f == nil || len(f.Metric) == 0 || f.Metric[0].Histogram == nil {
		return nil
	}
	var out []float64
	for _, b := range f.Metric[0].Histogram.Bucket {
		out = append(out, b.GetUpperBound())
	}
	return out
}

// Every counter whose labels take a known set of values has each series from
// start-up, at 0, before anything happened: a series that appears only at its
// first event cannot be told from a counter the product lacks (the chaos
// harness read that as "n/a"), and rate() misses its first increase.
func TestLabelledCountersFromStart(t *testing.T) {
	d := startDev(t, func(c *program.DevConfig) { c.HTTP.Auth = true })
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
	reasons := client.Reasons()
	for _, r := range []string{client.ReasonWorkerLost, client.ReasonGap, client.ReasonSilent, "worker_busy"} {
		if !slices.Contains(reasons, r) {
			t.Fatalf("client.Reasons() %v lacks %s", reasons, r)
		}
	}
	type series struct {
		label  string
		values []string
	}
	want := map[string][]series{
		"tokenbus_client_retries_total":           {{"reason", reasons}},
		"tokenbus_client_migrations_total":        {{"reason", reasons}},
		"tokenbus_client_migrations_failed_total": {{"reason", reasons}},
		"tokenbus_dispatcher_rejected_total": {{"reason", []string{"bad_request", "model_mismatch", "bad_reply_subject",
			"no_worker", "queue_full", "queue_timeout", "no_keys", "unknown_key", "key_lookup", "model_not_allowed", "rate_limited"}}},
		"tokenbus_dispatcher_adapter_routed_total":     {{"placement", []string{"holder", "free_slot", "evict"}}},
		"tokenbus_dispatcher_adapter_placements_total": {{"action", []string{"load", "unload", "evict"}}, {"result", []string{"ok", "error"}}},
		"tokenbus_worker_requests_total":               {{"outcome", []string{"ok", "error", "cancelled", "bounced"}}, {"worker", []string{"dev-worker-1", "dev-worker-2"}}},
		"tokenbus_auth_decisions_total": {{"outcome", []string{"ok", "missing_key", "invalid_key", "throttled", "unavailable",
			"model_not_allowed", "rate_limited", "readmitted", "fail_open", "fail_closed"}}},
		"tokenbus_auth_failures_total":             {{"reason", []string{"malformed_key", "unknown_key", "wrong_admin_token"}}},
		"tokenbus_batch_lines_total":               {{"outcome", []string{"ok", "error", "cancelled", "expired", "revoked", "retried"}}},
		"tokenbus_redis_breaker_transitions_total": {{"to", []string{"closed", "half_open", "open"}}},
	}
	for name, labels := range want {
		f := families[name]
		if f == nil {
			t.Errorf("%s: no series at start-up", name)
			continue
		}
		for _, l := range labels {
			seen := map[string]bool{}
			for _, m := range f.Metric {
				for _, lp := range m.Label {
					if lp.GetName() == l.label {
						seen[lp.GetValue()] = true
					}
				}
				if v := m.GetCounter().GetValue(); v != 0 {
					t.Errorf("%s %v = %v at start-up", name, m.Label, v)
				}
			}
			for _, v := range l.values {
				if !seen[v] {
					t.Errorf("%s{%s=%q}: no series at start-up", name, l.label, v)
				}
			}
		}
	}
}
