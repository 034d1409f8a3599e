package workers

import (
	"math"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Predicted against actual cached prompt tokens. A dispatcher that routed a
// request by prefix says how much of the prompt it predicts this worker's
// engine holds (schemas.HdrPrefixCached: bytes of the prompt text); when the
// request ends with usage that carries prompt_tokens_details.cached_tokens,
// the prediction becomes tokens (the same share of usage.prompt_tokens) and
// is set against them: in metrics, on the request's span and in its log
// line. Without a prediction, or without cached_tokens from the engine
// (vLLM without --enable-prompt-tokens-details), nothing is counted. Once
// per request, at its end: nothing on the per-token path.

// prefixPrediction is a request's HdrPrefixCached: cached of total bytes of
// its prompt text; total 0 when absent or malformed.
type prefixPrediction struct{ cached, total int }

func readPrefixPrediction(h nats.Header) prefixPrediction {
	v := h.Get(schemas.HdrPrefixCached)
	if v == "" {
		return prefixPrediction{}
	}
	c, t, ok := schemas.ParsePrefixCached(v)
	if !ok {
		return prefixPrediction{}
	}
	return prefixPrediction{cached: c, total: t}
}

// prefixComparison is a finished request's predicted and actual cached
// prompt tokens; ok is false when there is nothing to compare.
type prefixComparison struct {
	predicted, actual int
	ok                bool
}

// compare turns the prediction into tokens against the engine's usage: the
// predicted share of the prompt's bytes, of its tokens.
func (p prefixPrediction) compare(u *schemas.Usage, estimated bool) prefixComparison {
	if p.total == 0 || estimated || u.PromptTokensDetails == nil {
		return prefixComparison{}
	}
	predicted := int(math.Round(float64(u.PromptTokens) * float64(p.cached) / float64(p.total)))
	return prefixComparison{predicted: predicted, actual: u.PromptTokensDetails.CachedTokens, ok: true}
}

// prefixMetrics count the comparisons (metrics.go registers them).
type prefixMetrics struct {
	predicted, actual prometheus.Counter
	diff              prometheus.Histogram // actual − predicted, tokens per request
}

// prefixDiffBuckets are symmetric around 0: a prediction too high (the
// engine evicted what the record says it holds) lands below, one too low
// (it holds what no dispatcher knew of) above.
var prefixDiffBuckets = []float64{-4096, -1024, -256, -64, -16, -0.5, 0.5, 16, 64, 256, 1024, 4096}

func newPrefixMetrics() prefixMetrics {
	const name, help = "tokenbus_worker_prefix_cached_tokens_total",
		"Prompt tokens served from the engine's prefix cache, predicted by the dispatcher that routed the request (source=predicted) and reported by the engine (source=actual), counted for requests that have both."
	return prefixMetrics{
		predicted: prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"source": "predicted"}}),
		actual:    prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"source": "actual"}}),
		diff: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tokenbus_worker_prefix_prediction_error_tokens",
			Help:    "Per request routed by prefix: cached prompt tokens the engine reported minus those the dispatcher predicted.",
			Buckets: prefixDiffBuckets}),
	}
}

func (m prefixMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.predicted, m.actual, m.diff}
}

// comparePrefix compares c's prediction with res's usage and counts it.
func (c *call) comparePrefix(res *engine.Result) prefixComparison {
	pc := c.prefix.compare(&res.Usage, res.UsageEstimated)
	if pc.ok {
		m := &c.w.m.prefix
		m.predicted.Add(float64(pc.predicted))
		m.actual.Add(float64(pc.actual))
		m.diff.Observe(float64(pc.actual - pc.predicted))
	}
	return pc
}
