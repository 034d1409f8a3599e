package dispatcher

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

type metrics struct {
	routed prometheus.Counter
	// adapterRouted counts requests for LoRA adapters by placement: holder,
	// free_slot (the worker loads it), evict (the worker evicts one to load it).
	adapterRouted *prometheus.CounterVec
	// adapterPlaced counts adapter placement by demand's control requests.
	adapterPlaced *prometheus.CounterVec
	bounces       prometheus.Counter
	rejected      *prometheus.CounterVec
	queueWait     prometheus.Histogram
	joined, lost  prometheus.Counter // workers that joined the fleet, and that it lost (heartbeats stopped)
	// cancelsIgnored counts queue cancels that matched no queued request:
	// a wrong or missing cancel token, or a request not queued here.
	cancelsIgnored prometheus.Counter
	admitFailOpen  prometheus.Counter // tenant requests let through because limits could not be checked
	// prefixHits and prefixMisses count prefix-aware routing decisions by
	// whether the worker chosen held any of the prompt by our record;
	// prefixPrompt and prefixPredicted sum the prompt tokens they routed and
	// those predicted cached (estimates: blocks × block bytes / 4), to set
	// against the engines' own prefix-cache hit counters.
	prefixHits, prefixMisses      prometheus.Counter
	prefixPrompt, prefixPredicted prometheus.Counter
	kvEvents                      prometheus.Counter // workers' KV events messages applied
	// switchRequests counts the model switches this dispatcher asked of
	// workers (switch.go), by outcome: accepted, refused, error.
	switchRequests *prometheus.CounterVec
	// disagg counts the disaggregation decisions (disagg.go) by reason.
	disagg *prometheus.CounterVec

	// Flow control (flow.go), by band and tenant; tenants beyond the first
	// maxTenantLabels seen share the label "other" (bounded cardinality).
	flowWait    *prometheus.HistogramVec // band, tenant
	flowRefused *prometheus.CounterVec   // band, tenant, reason
	flowTokens  *prometheus.CounterVec   // band, tenant: prompt + completion tokens of settled requests
	settled     prometheus.Histogram     // real cost / estimate
	tenants     tenantLabels

	// Capacity on demand (hold.go).
	coldStarts       *prometheus.CounterVec // outcome: started, served, gave_up
	coldStartSeconds prometheus.Histogram   // first request held to capacity up
	capacityWait     prometheus.Histogram   // time held requests waited before a worker took them
}

// waited observes a queued request's wait in its flow.
func (m *metrics) waited(band schemas.Band, tenant string, seconds float64) {
	m.flowWait.WithLabelValues(band.String(), m.tenants.label(tenant)).Observe(seconds)
}

// refused counts a request of a flow refused or dropped from a queue.
func (m *metrics) refused(band schemas.Band, tenant, reason string) {
	m.flowRefused.WithLabelValues(band.String(), m.tenants.label(tenant), reason).Inc()
}

// maxTenantLabels bounds the tenant label's values.
const maxTenantLabels = 20

// tenantLabels gives the first maxTenantLabels tenants a label value of
// their own and every later one "other". "" (no tenant) is "none".
type tenantLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

func (t *tenantLabels) label(tenant string) string {
	if tenant == "" {
		return "none"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.seen[tenant]; ok {
		return tenant
	}
	if t.seen == nil {
		t.seen = map[string]struct{}{}
	}
	if len(t.seen) >= maxTenantLabels || tenant == "other" || tenant == "none" {
		return "other"
	}
	t.seen[tenant] = struct{}{}
	return tenant
}

// prefixRouted counts a prefix-aware decision: cached of blocks blocks of
// block bytes held by the worker chosen.
func (m *metrics) prefixRouted(cached, blocks, block int) {
	if cached > 0 {
		m.prefixHits.Inc()
	} else {
		m.prefixMisses.Inc()
	}
	m.prefixPrompt.Add(float64(blocks * block / bytesPerToken))
	m.prefixPredicted.Add(float64(cached * block / bytesPerToken))
}

// The label values of the counters with labels. Each series is made at
// start-up, at 0: one that appears only at its first event cannot be told
// from a counter the product lacks, and rate() misses its first increase.
var (
	rejectReasons = []string{"bad_request", "model_mismatch", "bad_reply_subject", "no_worker", "queue_full", "queue_timeout",
		"no_keys", "unknown_key", "key_lookup", "model_not_allowed", "rate_limited", "wait_too_long"}
	flowRefusals     = []string{"wait_too_long", "queue_full", "evicted", "queue_timeout"}
	placements       = []fleet.Placement{fleet.PlacedHolder, fleet.PlacedFreeSlot, fleet.PlacedEvict}
	placementActions = []string{"load", "unload", "evict"}
	coldOutcomes     = []string{"started", "served", "gave_up"}
)

func newMetrics() *metrics {
	m := newCollectors()
	for _, r := range rejectReasons {
		m.rejected.WithLabelValues(r)
	}
	for _, o := range coldOutcomes {
		m.coldStarts.WithLabelValues(o)
	}
	for _, p := range placements {
		m.adapterRouted.WithLabelValues(p.String())
	}
	for b := schemas.BandCritical; b < schemas.NumBands; b++ {
		for _, r := range flowRefusals {
			m.flowRefused.WithLabelValues(b.String(), "none", r)
		}
		m.flowTokens.WithLabelValues(b.String(), "none")
	}
	for _, r := range disaggReasons {
		m.disagg.WithLabelValues(r)
	}
	for _, o := range []string{"accepted", "refused", "error"} {
		m.switchRequests.WithLabelValues(o)
	}
	for _, a := range placementActions {
		m.adapterPlaced.WithLabelValues(a, "ok")
		m.adapterPlaced.WithLabelValues(a, "error")
	}
	return m
}

func newCollectors() *metrics {
	return &metrics{
		disagg: newDisaggCounter(),
		routed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_routed_total", Help: "Requests forwarded to a worker."}),
		adapterPlaced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_adapter_placements_total",
			Help: "Adapter placement by demand: loads of hot adapters onto one more worker (load), unloads of a cold adapter's spare replica (unload), unloads of a cold adapter to free a slot for a hot one (evict), by result (ok, error)."},
			[]string{"action", "result"}),
		adapterRouted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_adapter_routed_total",
			Help: "Requests for LoRA adapters routed, by placement: holder (had it loaded or loading), free_slot (loads it), evict (evicts one to load it)."},
			[]string{"placement"}),
		bounces: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_bounces_total", Help: "Requests handed back by a full worker and routed again."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_rejected_total", Help: "Requests answered with an error, by reason."}, []string{"reason"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_dispatcher_queue_wait_seconds", Help: "Time requests spent queued before a worker took them.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
		joined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_workers_joined_total", Help: "Workers that joined this dispatcher's fleet (first heartbeat)."}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_workers_lost_total", Help: "Workers this dispatcher dropped because their heartbeats stopped."}),
		cancelsIgnored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_cancels_ignored_total",
			Help: "Queue cancels that matched no request queued here: a wrong or missing cancel token, or a request not (or no longer) queued here."}),
		admitFailOpen: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_admit_fail_open_total",
			Help: "Tenant requests let through because their key's limits could not be checked."}),
		prefixHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_prefix_routed_total", ConstLabels: prometheus.Labels{"result": "hit"},
			Help: "Prefix-aware routing decisions, by whether the worker chosen holds part of the prompt by this dispatcher's record."}),
		prefixMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_prefix_routed_total", ConstLabels: prometheus.Labels{"result": "miss"},
			Help: "Prefix-aware routing decisions, by whether the worker chosen holds part of the prompt by this dispatcher's record."}),
		prefixPrompt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_prefix_prompt_tokens_total",
			Help: "Prompt tokens (estimated from whole hashed blocks) of the requests routed prefix-aware."}),
		kvEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_kv_events_total",
			Help: "Workers' KV cache event messages applied to this dispatcher's record of their prefix caches."}),
		flowWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tokenbus_dispatcher_flow_wait_seconds", Help: "Time requests spent queued before a worker took them, by band and tenant (tenants past the first 20 seen: other; no tenant: none).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}, []string{"band", "tenant"}),
		flowRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_flow_refused_total",
			Help: "Requests flow control refused or took out of a queue, by band, tenant and reason: wait_too_long (could not start before its deadline or max_queue_ms: refused at once), queue_full, evicted (made room in a full queue for a tenant holding less of it), queue_timeout."},
			[]string{"band", "tenant", "reason"}),
		flowTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_flow_tokens_total",
			Help: "Prompt and completion tokens of the requests this dispatcher took out of a queue and whose worker reported their usage, by band and tenant."},
			[]string{"band", "tenant"}),
		settled: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_dispatcher_cost_estimate_ratio", Help: "Real cost of a queued request over its estimate (flow control settles the difference).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 0.8, 1, 1.25, 2, 4, 10}}),
		coldStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_cold_starts_total",
			Help: "Holds for capacity (docs/capacity.md): a model no live worker served got a request (started), then capacity came (served) or its held requests all left first (gave_up: timed out, cancelled)."},
			[]string{"outcome"}),
		coldStartSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_dispatcher_cold_start_seconds", Help: "From the first request held for a model no live worker served to a worker serving it.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}}),
		capacityWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_dispatcher_capacity_wait_seconds", Help: "Time requests held for capacity (queued while no live worker served their model) waited before a worker took them.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}}),
		switchRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_switch_requests_total",
			Help: "Model switches this dispatcher asked of workers for requests waiting for a model no worker serves, by outcome: accepted, refused (the worker's hold, or another switch under way), error (no answer)."},
			[]string{"outcome"}),
		prefixPredicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_dispatcher_prefix_predicted_cached_tokens_total",
			Help: "Prompt tokens (estimated) the worker chosen was predicted to hold in its prefix cache."}),
	}
}

// register registers d's metrics on reg (nil: nowhere).
func (d *Dispatcher) register(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	m := d.m
	reg.MustRegister(m.disagg, m.routed, m.adapterRouted, m.adapterPlaced, m.bounces, m.rejected, m.queueWait, m.joined, m.lost, m.cancelsIgnored, m.admitFailOpen,
		m.prefixHits, m.prefixMisses, m.prefixPrompt, m.prefixPredicted, m.kvEvents, m.flowWait, m.flowRefused, m.flowTokens, m.settled,
		m.coldStarts, m.coldStartSeconds, m.capacityWait, m.switchRequests, modelCollector{d})
}

// The per-model gauges are read at scrape time (modelCollector), not kept up
// to date on the request path: a gauge that is written only when something
// happens has no series until then, and one deleted when its queue empties
// leaves an autoscaler reading nothing. Read at each scrape, every model the
// dispatcher knows has a value, 0 when idle.
var (
	descQueueDepth = prometheus.NewDesc("tokenbus_dispatcher_queue_depth",
		"Requests waiting in this dispatcher for a worker, by model (0 for every known model with none).", []string{"model"}, nil)
	descWorkers = prometheus.NewDesc("tokenbus_dispatcher_workers",
		"Live, healthy, non-draining workers serving the model, as this dispatcher sees them.", []string{"model"}, nil)
	descFlowQueued = prometheus.NewDesc("tokenbus_dispatcher_flow_queued",
		"Requests waiting in this dispatcher, by model, band and tenant: the 20 tenants with the most queued, the rest summed as other.", []string{"model", "band", "tenant"}, nil)
	descCapacityWaiting = prometheus.NewDesc("tokenbus_dispatcher_capacity_waiting",
		"Requests held in this dispatcher for a model that no live worker serves (waiting for one to start, wake or switch), by model: 0 for every known model with none. Scale from zero on it.", []string{"model"}, nil)
	descRunning = prometheus.NewDesc("tokenbus_dispatcher_running",
		"Requests in flight on the live workers serving the model, as this dispatcher estimates them (their last report plus what was sent since).", []string{"model"}, nil)
)

// modelCollector reports the per-model gauges of a dispatcher.
type modelCollector struct{ d *Dispatcher }

func (c modelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descQueueDepth
	ch <- descCapacityWaiting
	ch <- descWorkers
	ch <- descRunning
	ch <- descFlowQueued
}

func (c modelCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.d.modelStats() {
		ch <- prometheus.MustNewConstMetric(descQueueDepth, prometheus.GaugeValue, float64(s.queued), s.model)
		ch <- prometheus.MustNewConstMetric(descCapacityWaiting, prometheus.GaugeValue, float64(s.cold), s.model)
		if s.base {
			ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(s.workers), s.model)
			ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(s.running), s.model)
		}
	}
	for _, f := range c.d.flowStats(maxTenantLabels) {
		ch <- prometheus.MustNewConstMetric(descFlowQueued, prometheus.GaugeValue, float64(f.Queued), f.Model, f.Band, f.Tenant)
	}
}

// modelStat is one model's line of the per-model gauges.
type modelStat struct {
	model   string
	base    bool // a base model (not a LoRA adapter): it has workers and running
	queued  int
	cold    int // of queued: held for capacity (no live worker serves the model)
	workers int // live, healthy, non-draining workers serving it
	running int // requests in flight on the live workers serving it
}

// modelStats lists every model the dispatcher knows: registered in the
// registry, served by a live worker, or with requests queued. The set is
// bounded by the registry and the workers' models (the gateway publishes only
// requests for those; a NATS-native client's request for anything else is
// refused at once, never queued, after the dispatcher's first seconds).
func (d *Dispatcher) modelStats() []modelStat {
	ws := d.fleet.Workers()
	byName := map[string]*modelStat{}
	get := func(name string) *modelStat {
		s := byName[name]
		if s == nil {
			s = &modelStat{model: name}
			byName[name] = s
		}
		return s
	}
	if d.models != nil {
		for _, m := range d.models.Models() {
			get(m.Name).base = !m.IsAdapter()
		}
	}
	for _, w := range ws {
		for _, name := range w.Models {
			s := get(name)
			if !slices.Contains(w.Adapters, name) {
				s.base = true
			}
		}
	}
	d.mu.Lock()
	for name, q := range d.queues {
		s := get(name)
		s.queued = q.Len()
		if d.coldQueueLocked(name, q) {
			s.cold = s.queued
		}
	}
	d.mu.Unlock()
	out := make([]modelStat, 0, len(byName))
	for _, s := range byName {
		if s.base {
			for _, w := range ws {
				if !slices.Contains(w.Models, s.model) {
					continue
				}
				s.running += w.Load
				if w.Healthy && !w.Draining {
					s.workers++
				}
			}
		}
		out = append(out, *s)
	}
	return out
}
