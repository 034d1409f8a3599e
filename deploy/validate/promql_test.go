package validate

import (
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// knownMetrics are the series a query may read: those tokenbus exports
// (gateway/metrics.go, auth/auth.go, dispatcher/metrics.go, workers/metrics.go,
// program/metrics.go), vLLM's own, and the recording rules of
// deploy/prometheus/tokenbus.rules.yml (added by recordedMetrics). The live
// Prometheus test (liveprom_test.go) checks the tokenbus ones against a real
// scrape.
var knownMetrics = map[string]bool{
	"tokenbus_gateway_stream_errors_total":                true,
	"tokenbus_gateway_tokens_total":                       true,
	"tokenbus_dispatcher_workers":                         true,
	"tokenbus_dispatcher_running":                         true,
	"tokenbus_dispatcher_workers_joined_total":            true,
	"tokenbus_dispatcher_workers_lost_total":              true,
	"tokenbus_nats_connected":                             true,
	"tokenbus_redis_up":                                   true,
	"tokenbus_usage_buffered":                             true,
	"tokenbus_usage_dropped_total":                        true,
	"tokenbus_worker_max_concurrency":                     true,
	"tokenbus_worker_requests_total":                      true,
	"tokenbus_gateway_requests_total":                     true,
	"tokenbus_gateway_time_to_first_token_seconds_bucket": true,
	"tokenbus_gateway_inter_token_latency_seconds_bucket": true,
	"tokenbus_gateway_request_duration_seconds_bucket":    true,
	"tokenbus_gateway_active_streams":                     true,
	"tokenbus_gateway_client_disconnects_total":           true,
	"tokenbus_gateway_output_chunks_total":                true,
	"tokenbus_dispatcher_routed_total":                    true,
	"tokenbus_dispatcher_bounces_total":                   true,
	"tokenbus_dispatcher_rejected_total":                  true,
	"tokenbus_dispatcher_queue_depth":                     true,
	"tokenbus_dispatcher_queue_wait_seconds_bucket":       true,
	"tokenbus_worker_running":                             true,
	"tokenbus_worker_waiting":                             true,
	"vllm:num_requests_running":                           true,
	"vllm:num_requests_waiting":                           true,
}

// knownLabels are the labels each tokenbus metric has (besides Prometheus's
// job and instance); a matcher or grouping on another label selects nothing.
var knownLabels = map[string][]string{
	"tokenbus_gateway_requests_total":                     {"route", "model", "status"},
	"tokenbus_gateway_time_to_first_token_seconds_bucket": {"model", "le"},
	"tokenbus_gateway_inter_token_latency_seconds_bucket": {"model", "le"},
	"tokenbus_gateway_request_duration_seconds_bucket":    {"route", "model", "le"},
	"tokenbus_gateway_output_chunks_total":                {"model"},
	"tokenbus_gateway_stream_errors_total":                {"model", "code"},
	"tokenbus_gateway_tokens_total":                       {"model", "type"},
	"tokenbus_dispatcher_workers":                         {"model"},
	"tokenbus_dispatcher_running":                         {"model"},
	"tokenbus_dispatcher_workers_joined_total":            {},
	"tokenbus_dispatcher_workers_lost_total":              {},
	"tokenbus_nats_connected":                             {},
	"tokenbus_redis_up":                                   {},
	"tokenbus_usage_buffered":                             {},
	"tokenbus_usage_dropped_total":                        {},
	"tokenbus_worker_requests_total":                      {"worker", "outcome"},
	"tokenbus_worker_max_concurrency":                     {"worker"},
	"tokenbus_dispatcher_rejected_total":                  {"reason"},
	"tokenbus_dispatcher_queue_depth":                     {"model"},
	"tokenbus_dispatcher_queue_wait_seconds_bucket":       {"le"},
	"tokenbus_worker_running":                             {"worker"},
	"tokenbus_worker_waiting":                             {"worker"},
}

// checkPromQL parses a query as Prometheus does and checks every series it
// selects; it returns, per metric, its equality matchers (label -> value).
func checkPromQL(t *testing.T, where, query string) map[string]map[string]string {
	t.Helper()
	expr, err := promParser.ParseExpr(query)
	if err != nil {
		t.Errorf("%s: %q: %v", where, query, err)
		return nil
	}
	out := map[string]map[string]string{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if agg, ok := node.(*parser.AggregateExpr); ok && !agg.Without {
			// sum by (x): every selected tokenbus metric must have label x.
			parser.Inspect(agg.Expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					if want, ok := knownLabels[vs.Name]; ok {
						for _, g := range agg.Grouping {
							if g != "job" && g != "instance" && !contains(want, g) {
								t.Errorf("%s: %q groups %s by %q, a label it does not have", where, query, vs.Name, g)
							}
						}
					}
				}
				return nil
			})
			return nil
		}
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if !knownMetrics[name] && !isRecorded(name) {
			t.Errorf("%s: %q reads %q, which no component exports (known: see knownMetrics)", where, query, name)
		}
		eq := map[string]string{}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName {
				continue
			}
			if want, ok := knownLabels[name]; ok && m.Name != "job" && m.Name != "instance" && !contains(want, m.Name) {
				t.Errorf("%s: %q matches label %q, which %s does not have", where, query, m.Name, name)
			}
			if m.Type == labels.MatchEqual {
				eq[m.Name] = m.Value
			}
		}
		out[name] = eq
		return nil
	})
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// promParser parses PromQL as a default Prometheus server does.
var promParser = parser.NewParser(parser.Options{})
