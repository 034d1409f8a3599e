package dispatcher

import (
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
)

// Prefill/decode disaggregation (docs/disaggregation.md). A request whose
// prompt is long enough goes to a decode worker with the id of a prefill
// worker (schemas.HdrPrefillWorker): the decode worker has that worker run
// the prefill (vLLM's KV-transfer handshake, workers/disagg.go) and streams
// from the transferred KV cache. The dispatcher decides per request, when
// it has chosen the decode worker as it chooses any worker (flow control's
// order, load, prefix cache): it disaggregates when
//
//   - the policy is on (DisaggConfig.MinPromptTokens > 0) and the request is a
//     chat or completion for a base model (an adapter's prefill would need
//     the adapter on a prefill worker too: not done), not a continuation;
//   - the prompt's tokens that the chosen worker does not hold by the
//     prefix record (estimated: text bytes / 4) are at least MinPromptTokens:
//     a prompt the decode worker mostly holds prefills there in one short step;
//   - a prefill worker of the model has room (fleet.AcquirePrefill: by
//     prefix score and load, as any worker is chosen).
//
// Otherwise the request runs whole, as it would without prefill workers.

// DisaggConfig is the disaggregation policy.
type DisaggConfig struct {
	// MinPromptTokens: a prompt with at least this many tokens not cached
	// on the chosen decode worker is prefilled on a prefill worker; 0: never.
	MinPromptTokens int
}

// Why a request was or was not disaggregated (the reason label of
// tokenbus_dispatcher_disagg_total).
const (
	disaggYes         = "disaggregated"
	disaggShort       = "short_prompt"
	disaggCached      = "cached"
	disaggNoPrefill   = "no_prefill_worker"
	disaggPrefillFull = "prefill_full"
	disaggNotApplied  = "not_applicable" // an adapter, a continuation, an embedding...
)

var disaggReasons = []string{disaggYes, disaggShort, disaggCached, disaggNoPrefill, disaggPrefillFull, disaggNotApplied}

func newDisaggCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenbus_dispatcher_disagg_total",
		Help: "Routing decisions for models with prefill workers: disaggregated (prefilled on a prefill worker), or whole, by reason: short_prompt, cached (the decode worker holds most of it), no_prefill_worker, prefill_full, not_applicable (an adapter, a continuation, not a chat or completion)."},
		[]string{"decision"})
}

// prompt is what choosePrefill needs of a request: its model, adapter,
// headers, prompt block hashes and text length (request's or queued's).
type prompt struct {
	model   string
	adapter *adapterRef
	h       nats.Header
	hashes  []uint64
	text    int
}

// choosePrefill decides for r, routed to a worker that holds cached of its
// prompt's blocks by our record: the prefill worker to run its prefill, or
// "" to run it whole. Only models with prefill workers count a decision.
func (d *Dispatcher) choosePrefill(r prompt, cached int, exclude string) string {
	min := d.cfg.Disagg.MinPromptTokens
	if min <= 0 || r.text == 0 || d.fleet.PrefillWorkers(r.model) == 0 {
		return ""
	}
	if r.adapter != nil || r.h.Get(schemas.HdrResume) != "" {
		d.m.disagg.WithLabelValues(disaggNotApplied).Inc()
		return ""
	}
	prompt := r.text / bytesPerToken
	held := cached * d.cfg.PrefixBlockBytes / bytesPerToken
	switch {
	case prompt < min:
		d.m.disagg.WithLabelValues(disaggShort).Inc()
		return ""
	case prompt-held < min:
		d.m.disagg.WithLabelValues(disaggCached).Inc()
		return ""
	}
	id, live, _, ok := d.fleet.AcquirePrefill(r.model, exclude, r.hashes)
	if !ok {
		reason := disaggPrefillFull
		if live == 0 {
			reason = disaggNoPrefill
		}
		d.m.disagg.WithLabelValues(reason).Inc()
		return ""
	}
	d.m.disagg.WithLabelValues(disaggYes).Inc()
	return id
}
