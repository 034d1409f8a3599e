package dispatcher

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	routed prometheus.Counter
	// adapterRouted counts requests for LoRA adapters by placement: holder,
	// free_slot (the worker loads it), evict (the worker evicts one to load it).
	adapterRouted *prometheus.CounterVec
	bounces       prometheus.Counter
	rejected      *prometheus.CounterVec
	queueDepth    *prometheus.GaugeVec
	queueWait     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		routed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_routed_total", Help: "Requests forwarded to a worker."}),
		adapterRouted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_adapter_routed_total",
			Help: "Requests for LoRA adapters routed, by placement: holder (had it loaded or loading), free_slot (loads it), evict (evicts one to load it)."},
			[]string{"placement"}),
		bounces: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_bounces_total", Help: "Requests handed back by a full worker and routed again."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_rejected_total", Help: "Requests answered with an error, by reason."}, []string{"reason"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenbus_dispatcher_queue_depth", Help: "Requests waiting for a worker, by model."}, []string{"model"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_dispatcher_queue_wait_seconds", Help: "Time requests spent queued before a worker took them.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
	}
	if reg != nil {
		reg.MustRegister(m.routed, m.adapterRouted, m.bounces, m.rejected, m.queueDepth, m.queueWait)
	}
	return m
}
