package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus series. Labels are bounded: route is
// a route pattern, model is a known model or "unknown".
type metrics struct {
	requests      *prometheus.CounterVec   // route, model, status
	ttft          *prometheus.HistogramVec // model
	itl           *prometheus.HistogramVec // model
	duration      *prometheus.HistogramVec // route, model
	activeStreams prometheus.Gauge
	disconnects   prometheus.Counter
	chunks        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_gateway_requests_total",
			Help: "HTTP requests by route pattern, model and status.",
		}, []string{"route", "model", "status"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenbus_gateway_time_to_first_token_seconds",
			Help:    "From the request's arrival to its first chunk, for streams.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenbus_gateway_inter_token_latency_seconds",
			Help:    "Time between consecutive chunk frames of a stream.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56},
		}, []string{"model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenbus_gateway_request_duration_seconds",
			Help:    "Whole request time; for streams, until the last byte was written.",
			Buckets: []float64{.005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"route", "model"}),
		activeStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenbus_gateway_active_streams",
			Help: "SSE streams being written.",
		}),
		disconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_gateway_client_disconnects_total",
			Help: "Requests whose client went away before they finished.",
		}),
		chunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_gateway_output_chunks_total",
			Help: "SSE chunk events written (one per OpenAI chunk object).",
		}),
	}
	reg.MustRegister(m.requests, m.ttft, m.itl, m.duration, m.activeStreams, m.disconnects, m.chunks)
	return m
}
