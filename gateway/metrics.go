package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
)

// metrics are the gateway's Prometheus series. Labels are bounded: route is
// a route pattern, model is a known model or "unknown", code an error code
// of the catalogue or "upstream".
type metrics struct {
	requests      *prometheus.CounterVec   // route, model, status
	ttft          *prometheus.HistogramVec // model
	itl           *prometheus.HistogramVec // model
	duration      *prometheus.HistogramVec // route, model
	activeStreams prometheus.Gauge
	disconnects   prometheus.Counter
	chunks        *prometheus.CounterVec // model
	streamErrors  *prometheus.CounterVec // model, code
	tokens        *prometheus.CounterVec // model, type (prompt, completion)
}

// Latency buckets, chosen for LLM serving (docs/metrics.md). Quantiles are
// interpolated within a bucket, so the bounds are dense where the answers
// matter: tens of milliseconds to a few seconds for the first token, a few
// to a hundred milliseconds between tokens, a second to minutes end to end.
// The worker's histograms use the same bounds (workers/metrics.go), so the
// two sides compare bucket for bucket.
var (
	ttftBuckets = []float64{.005, .01, .02, .03, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120}
	itlBuckets  = []float64{.001, .0025, .005, .0075, .01, .015, .02, .025, .03, .04, .05, .075, .1, .15, .2, .3, .5, .75, 1, 2.5, 5}
	e2eBuckets  = []float64{.005, .01, .025, .05, .1, .2, .3, .4, .5, .75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600}
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_gateway_requests_total",
			Help: "HTTP requests by route pattern, model and status.",
		}, []string{"route", "model", "status"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenbus_gateway_time_to_first_token_seconds",
			Help:    "From the request's arrival to its first chunk, for streams.",
			Buckets: ttftBuckets,
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenbus_gateway_inter_token_latency_seconds",
			Help:    "Time between consecutive chunk frames of a stream.",
			Buckets: itlBuckets,
		}, []string{"model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenbus_gateway_request_duration_seconds",
			Help:    "Whole request time; for streams, until the last byte was written.",
			Buckets: e2eBuckets,
		}, []string{"route", "model"}),
		activeStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenbus_gateway_active_streams",
			Help: "SSE streams being written.",
		}),
		disconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_gateway_client_disconnects_total",
			Help: "Requests whose client went away before they finished.",
		}),
		chunks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_gateway_output_chunks_total",
			Help: "SSE chunk events written (one per OpenAI chunk object), by model.",
		}, []string{"model"}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_gateway_stream_errors_total",
			Help: "Streams that ended with an error event after their first chunk (their status was already 200), by model and error code.",
		}, []string{"model", "code"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_gateway_tokens_total",
			Help: "Tokens of the requests that finished, from their usage, by model and type (prompt, completion).",
		}, []string{"model", "type"}),
	}
	reg.MustRegister(m.requests, m.ttft, m.itl, m.duration, m.activeStreams, m.disconnects, m.chunks, m.streamErrors, m.tokens)
	return m
}

// catalogueCodes are the error codes tokenbus itself sends.
var catalogueCodes = func() map[string]bool {
	codes := map[string]bool{}
	for _, d := range schemas.Catalogue {
		if d.Code != "" {
			codes[d.Code] = true
		}
	}
	return codes
}()

// codeLabel is e's code as a metric label: a code of the catalogue, or
// "upstream" for an engine's own error passed through (whose code the
// engine chose, so it is no bounded label).
func codeLabel(e *schemas.Error) string {
	if e.Body.Code != nil && catalogueCodes[*e.Body.Code] {
		return *e.Body.Code
	}
	return "upstream"
}
