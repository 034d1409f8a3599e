package simserver

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// vLLM's (V1) metric names. Every series but vllm:lora_requests_info has the
// labels model_name (the first base name) and engine ("0"), as vLLM's.
const (
	mRunning     = "vllm:num_requests_running"
	mWaiting     = "vllm:num_requests_waiting"
	mKVCache     = "vllm:kv_cache_usage_perc"
	mGPUCache    = "vllm:gpu_cache_usage_perc"
	mLoRAInfo    = "vllm:lora_requests_info"
	mPrompt      = "vllm:prompt_tokens_total"
	mGeneration  = "vllm:generation_tokens_total"
	mSuccess     = "vllm:request_success_total"
	mQueries     = "vllm:prefix_cache_queries_total"
	mHits        = "vllm:prefix_cache_hits_total"
	mPreemptions = "vllm:num_preemptions_total"
	mTTFT        = "vllm:time_to_first_token_seconds"
	mITL         = "vllm:inter_token_latency_seconds"
	mE2E         = "vllm:e2e_request_latency_seconds"

	// Prefill/decode disaggregation (sim/disagg.go): vLLM's NixlConnector
	// metrics where vLLM has one, tokenbus_sim_* where it has none.
	mKVExpired      = "vllm:nixl_num_kv_expired_reqs_total"     // prefill side: holds freed with no pull
	mKVFailed       = "vllm:nixl_num_failed_transfers_total"    // decode side: requests whose KV could not be taken
	mPromptBySource = "vllm:prompt_tokens_by_source_total"      // {source=local_compute|local_cache_hit|external_kv_transfer}
	mKVPrefills     = "tokenbus_sim_kv_transfer_prefills_total" // prefill side: answered with kv_transfer_params
	mKVPulls        = "tokenbus_sim_kv_transfer_pulls_total"    // prefill side: {outcome=taken|refused}
	mRemotePrefills = "tokenbus_sim_remote_prefills_total"      // decode side: requests that took a remote prefill's KV
	mKVHeldRequests = "tokenbus_sim_kv_held_requests"           // prefill side: holds now
	mKVHeldBlocks   = "tokenbus_sim_kv_held_blocks"             // prefill side: KV blocks held now for decode engines
)

// vLLM's buckets.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
		20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
		20.0, 40.0, 80.0}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
		240.0, 480.0, 960.0, 1920.0, 7680.0}
	finishReasons = []string{"stop", "length", "abort"}
)

// loraCount is the requests in flight on one adapter.
type loraCount struct{ running, waiting int }

type loraLabels struct{ running, waiting string }

const maxLoRASeries = 64

func (s *Server) initMetrics() {
	s.reg = prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": s.model, "engine": "0"}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		s.reg.MustRegister(h)
		return h
	}
	s.ttft = hist(mTTFT, "Histogram of time to first token in seconds.", ttftBuckets)
	s.itl = hist(mITL, "Histogram of inter-token latency in seconds.", itlBuckets)
	s.e2e = hist(mE2E, "Histogram of e2e request latency in seconds.", latencyBuckets)
	s.reg.MustRegister(newSimCollector(s, labels))
	s.metrics = promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
}

// simCollector reads the sim's Stats and Metrics at every scrape.
type simCollector struct {
	s                                                        *Server
	running, waiting, kv, gpu, lora                          *prometheus.Desc
	prompt, generation, success, queries, hits, preemptions  *prometheus.Desc
	kvExpired, kvFailed, promptBySource, kvPrefills, kvPulls *prometheus.Desc
	remotePrefills, kvHeldRequests, kvHeldBlocks             *prometheus.Desc
}

func newSimCollector(s *Server, labels prometheus.Labels) *simCollector {
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, variable, labels)
	}
	return &simCollector{
		s:           s,
		running:     d(mRunning, "Number of requests in model execution batches."),
		waiting:     d(mWaiting, "Number of requests waiting to be processed."),
		kv:          d(mKVCache, "KV-cache usage. 1 means 100 percent usage."),
		gpu:         d(mGPUCache, "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead."),
		lora:        prometheus.NewDesc(mLoRAInfo, "Running stats on lora requests.", []string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"}, nil),
		prompt:      d(mPrompt, "Number of prefill tokens processed."),
		generation:  d(mGeneration, "Number of generation tokens processed."),
		success:     d(mSuccess, "Count of successfully processed requests.", "finished_reason"),
		queries:     d(mQueries, "Prefix cache queries, in terms of number of queried tokens."),
		hits:        d(mHits, "Prefix cache hits, in terms of number of cached tokens."),
		preemptions: d(mPreemptions, "Cumulative number of preemption from the engine."),

		kvExpired:      d(mKVExpired, "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance."),
		kvFailed:       d(mKVFailed, "Number of failed NIXL KV Cache transfers."),
		promptBySource: d(mPromptBySource, "Number of prompt tokens by source.", "source"),
		kvPrefills:     d(mKVPrefills, "Prefills for a remote decode answered with kv_transfer_params (their KV blocks held)."),
		kvPulls:        d(mKVPulls, "Pulls of held KV blocks by decode engines, by outcome: taken or refused.", "outcome"),
		remotePrefills: d(mRemotePrefills, "Requests that took the KV blocks of a remote prefill."),
		kvHeldRequests: d(mKVHeldRequests, "Prefills whose KV blocks are held now for a remote decode."),
		kvHeldBlocks:   d(mKVHeldBlocks, "KV blocks held now for remote decodes (counted in the KV-cache usage)."),
	}
}

func (c *simCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kv, c.lora, c.prompt, c.generation, c.success, c.queries, c.hits, c.preemptions,
		c.kvExpired, c.kvFailed, c.promptBySource, c.kvPrefills, c.kvPulls, c.remotePrefills, c.kvHeldRequests, c.kvHeldBlocks} {
		ch <- d
	}
	if c.s.cfg.GPUCacheMetric {
		ch <- c.gpu
	}
}

func (c *simCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.eng.Stats()
	m := c.s.eng.Metrics()
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	gauge(c.running, float64(st.Running))
	gauge(c.waiting, float64(st.Waiting))
	gauge(c.kv, st.KVCacheUsage)
	if c.s.cfg.GPUCacheMetric {
		gauge(c.gpu, st.KVCacheUsage)
	}
	counter(c.prompt, m.PromptTokens)
	counter(c.generation, m.GenerationTokens)
	for _, r := range finishReasons {
		counter(c.success, m.RequestSuccess[r], r)
	}
	counter(c.queries, m.PrefixCacheQueries)
	counter(c.hits, m.PrefixCacheHits)
	counter(c.preemptions, m.Preemptions)
	x := c.s.eng.KVTransferStats()
	counter(c.kvExpired, x.Expired)
	counter(c.kvFailed, x.Failed)
	local := max(int64(m.PromptTokens)-int64(m.PrefixCacheHits)-int64(x.TransferredTokens), 0)
	counter(c.promptBySource, uint64(local), "local_compute")
	counter(c.promptBySource, m.PrefixCacheHits, "local_cache_hit")
	counter(c.promptBySource, x.TransferredTokens, "external_kv_transfer")
	counter(c.kvPrefills, x.Prefills)
	counter(c.kvPulls, x.Pulls, "taken")
	counter(c.kvPulls, x.PullsRefused, "refused")
	counter(c.remotePrefills, x.RemotePrefills)
	gauge(c.kvHeldRequests, float64(x.HeldRequests))
	gauge(c.kvHeldBlocks, float64(x.HeldBlocks))
	maxLora := strconv.Itoa(st.MaxLoras)
	for l, t := range c.s.loraInfo() {
		gauge(c.lora, t, maxLora, l.waiting, l.running)
	}
}

// loraBegin counts a request on adapter ("" for the base model: nothing).
func (s *Server) loraBegin(adapter string, running bool) {
	if adapter == "" {
		return
	}
	s.loraMu.Lock()
	c := s.loraLoad[adapter]
	if c == nil {
		c = &loraCount{}
		s.loraLoad[adapter] = c
	}
	if running {
		c.running++
	} else {
		c.waiting++
	}
	s.loraMu.Unlock()
}

// loraRunning moves a streaming request on adapter from waiting to running
// (at its first chunk).
func (s *Server) loraRunning(adapter string) {
	if adapter == "" {
		return
	}
	s.loraMu.Lock()
	if c := s.loraLoad[adapter]; c != nil {
		c.waiting--
		c.running++
	}
	s.loraMu.Unlock()
}

func (s *Server) loraEnd(adapter string, running bool) {
	if adapter == "" {
		return
	}
	s.loraMu.Lock()
	if c := s.loraLoad[adapter]; c != nil {
		if running {
			c.running--
		} else {
			c.waiting--
		}
		if c.running <= 0 && c.waiting <= 0 {
			delete(s.loraLoad, adapter)
		}
	}
	s.loraMu.Unlock()
}

// loraInfo is vLLM's vllm:lora_requests_info: one series per set of
// running and waiting adapters ever seen (the newest maxLoRASeries), each
// valued at the last time it was current; the current one is stamped now.
func (s *Server) loraInfo() map[loraLabels]float64 {
	s.loraMu.Lock()
	defer s.loraMu.Unlock()
	var run, wait []string
	for name, c := range s.loraLoad {
		if c.running > 0 {
			run = append(run, name)
		}
		if c.waiting > 0 {
			wait = append(wait, name)
		}
	}
	slices.Sort(run)
	slices.Sort(wait)
	cur := loraLabels{running: strings.Join(run, ","), waiting: strings.Join(wait, ",")}
	if _, ok := s.loraSeries[cur]; ok {
		s.loraOrder = slices.DeleteFunc(s.loraOrder, func(l loraLabels) bool { return l == cur })
	}
	s.loraOrder = append(s.loraOrder, cur)
	s.loraSeries[cur] = float64(time.Now().UnixNano()) / 1e9
	for len(s.loraOrder) > maxLoRASeries {
		delete(s.loraSeries, s.loraOrder[0])
		s.loraOrder = s.loraOrder[1:]
	}
	return maps.Clone(s.loraSeries)
}
