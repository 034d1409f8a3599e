package workers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/workers/engine"
)

// metrics are the worker's Prometheus metrics, all labelled with the worker
// id (several workers may share one registry, as in `tokenbus dev`).
type metrics struct {
	requests *prometheus.CounterVec // by outcome
	ttft     prometheus.Histogram
	e2e      prometheus.Histogram
	// cancelsIgnored: cancels with a wrong or missing token, or for a
	// request not running here.
	cancelsIgnored prometheus.Counter
	// publishErrors: reply frames (or a multiplexed message of them) NATS
	// would not take; each fails its request.
	publishErrors prometheus.Counter
	prefix        prefixMetrics // predicted against actual cached prompt tokens (prefixcache.go)
	disagg        disaggMetrics // prefill/decode disaggregation (disagg.go)
}

// Latency buckets for LLM serving, the gateway's (gateway/metrics.go,
// docs/metrics.md), so that the worker's and the gateway's histograms
// compare bucket for bucket.
var (
	ttftBuckets = []float64{.005, .01, .02, .03, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120}
	e2eBuckets  = []float64{.005, .01, .025, .05, .1, .2, .3, .4, .5, .75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600}
)

func (w *Worker) registerMetrics(reg prometheus.Registerer) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_worker_requests_total", Help: "Requests the worker finished, by outcome (ok, error, cancelled, bounced)."},
			[]string{"outcome"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_worker_time_to_first_token_seconds", Help: "From admission to the engine's first chunk (streams).", Buckets: ttftBuckets}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_worker_request_duration_seconds", Help: "From admission to the end of the request.", Buckets: e2eBuckets}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_worker_publish_errors_total",
			Help: "Reply messages NATS would not take (connection down, too large): each fails its request or requests."}),
		cancelsIgnored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_worker_cancels_ignored_total",
			Help: "Cancels ignored: a wrong or missing cancel token, or a request not (or no longer) running here."}),
		prefix: newPrefixMetrics(),
		disagg: newDisaggMetrics(),
	}
	for _, o := range []string{"ok", "error", "cancelled", "bounced"} {
		m.requests.WithLabelValues(o) // each from start-up, at 0
	}
	w.m = m
	if reg == nil {
		return
	}
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"worker": w.cfg.ID}, reg)
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.prefix.collectors()...)
	reg.MustRegister(m.disagg.collectors()...)
	reg.MustRegister(w.sw.collectors()...)
	reg.MustRegister(m.requests, m.ttft, m.e2e, m.cancelsIgnored, m.publishErrors,
		gauge("tokenbus_worker_running", "Requests admitted and not finished.", func() float64 { return float64(w.Running()) }),
		gauge("tokenbus_worker_max_concurrency", "The worker's admission cap.", func() float64 { return float64(w.cfg.MaxConcurrency) }),
		gauge("tokenbus_worker_waiting", "Requests queued inside the engine.", func() float64 { return float64(w.eng.Stats().Waiting) }),
		gauge("tokenbus_worker_kv_cache_usage", "The engine's KV cache use, 0 to 1.", func() float64 { return w.eng.Stats().KVCacheUsage }),
		gauge("tokenbus_worker_engine_healthy", "1 when the engine's health check passes.", func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if w.eng.Health(ctx) == nil {
				return 1
			}
			return 0
		}),
		gauge("tokenbus_worker_draining", "1 while the worker drains.", func() float64 {
			if w.draining.Load() {
				return 1
			}
			return 0
		}),
		counter("tokenbus_worker_adapter_loads_total", "LoRA adapters loaded.", func() float64 { return float64(w.AdapterStats().Loads) }),
		counter("tokenbus_worker_adapter_load_failures_total", "LoRA adapter loads that failed.", func() float64 { return float64(w.AdapterStats().LoadFailures) }),
		counter("tokenbus_worker_adapter_evictions_total", "LoRA adapters unloaded to make room.", func() float64 { return float64(w.AdapterStats().Evictions) }),
	)
	if w.sleep != nil {
		reg.MustRegister(w.sleep.collectors()...)
	}
	if ks, ok := w.eng.(engine.KVEventStatser); ok {
		reg.MustRegister(kvEventCollectors(ks)...)
	}
}

// kvEventCollectors export the counts of an engine that reads KV events from
// elsewhere (vLLM's, over ZMQ) and maps them to text blocks.
func kvEventCollectors(ks engine.KVEventStatser) []prometheus.Collector {
	counter := func(name, help string, f func(engine.KVEventStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(ks.KVEventStats())) })
	}
	blocks := prometheus.NewDesc("tokenbus_worker_engine_kv_blocks_total",
		"Blocks the engine's KV events said it stored, by whether they mapped to a prompt's text (mapped) or not (unmapped: generated tokens, a prompt not tokenized, a parent unknown).",
		[]string{"result"}, nil)
	tokenize := prometheus.NewDesc("tokenbus_worker_engine_kv_tokenize_total",
		"Prompts handed to the KV events mapping, by what became of them: sent to the engine's /tokenize (call), failed there (error), dropped with the queue full (dropped), skipped as mapped recently (known).",
		[]string{"result"}, nil)
	return []prometheus.Collector{
		counter("tokenbus_worker_engine_kv_messages_total", "KV event messages read from the engine's publisher.", func(s engine.KVEventStats) uint64 { return s.Received }),
		counter("tokenbus_worker_engine_kv_decode_errors_total", "KV event messages not read: bad frames or payload.", func(s engine.KVEventStats) uint64 { return s.DecodeErrors }),
		counter("tokenbus_worker_engine_kv_unknown_events_total", "KV events of a kind not known (skipped) or of another medium or cache group (ignored).", func(s engine.KVEventStats) uint64 { return s.Unknown + s.Skipped }),
		counter("tokenbus_worker_engine_kv_connects_total", "Connections made to the engine's KV events publisher.", func(s engine.KVEventStats) uint64 { return s.Connects }),
		counter("tokenbus_worker_engine_kv_lost_total", "Times KV events were lost (a sequence gap, a reconnect, all blocks cleared): each makes dispatchers clear their record of the worker.", func(s engine.KVEventStats) uint64 { return s.Lost }),
		collectorFunc{descs: []*prometheus.Desc{blocks, tokenize}, collect: func(ch chan<- prometheus.Metric) {
			s := ks.KVEventStats()
			for _, v := range []struct {
				d     *prometheus.Desc
				label string
				n     uint64
			}{{blocks, "mapped", s.Mapped}, {blocks, "unmapped", s.Unmapped},
				{tokenize, "call", s.TokenizeCalls}, {tokenize, "error", s.TokenizeErrors},
				{tokenize, "dropped", s.TokenizeDropped}, {tokenize, "known", s.TokenizeKnown}} {
				ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), v.label)
			}
		}},
	}
}

// collectorFunc is a prometheus.Collector of fixed descriptions.
type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
