package bench

import (
	"math"
	"slices"
	"time"
)

// Dist summarises a sample: count, mean, percentiles and max. Latencies are in
// milliseconds.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// percentile of an ascending sample, p in [0, 100], interpolating linearly
// between closest ranks (numpy.percentile's default). NaN for an empty sample.
func percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	rank := p / 100 * float64(n-1)
	lo := int(rank)
	frac := rank - float64(lo)
	if lo+1 >= n {
		return sorted[n-1]
	}
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// summarize sorts xs in place and summarises it. An empty sample gives N = 0
// and zeros (JSON has no NaN).
func summarize(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Dist{
		N:    len(xs),
		Mean: sum / float64(len(xs)),
		P50:  percentile(xs, 50),
		P90:  percentile(xs, 90),
		P99:  percentile(xs, 99),
		Max:  xs[len(xs)-1],
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Summary is everything measured for one endpoint.
type Summary struct {
	Name     string `json:"name"` // "target" or "baseline"
	URL      string `json:"url"`
	Model    string `json:"model"`
	Endpoint string `json:"endpoint"`
	Stream   bool   `json:"stream"`

	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`

	DurationS   float64 `json:"duration_s"` // time under load (sum of its phases)
	InputTokens int     `json:"input_tokens"`
	// CachedTokens: of InputTokens, those the server reported served from
	// its prefix cache (usage.prompt_tokens_details.cached_tokens).
	CachedTokens    int  `json:"cached_input_tokens"`
	OutputTokens    int  `json:"output_tokens"`
	TokensFromUsage bool `json:"tokens_from_usage"` // false: some counts are content chunks or words

	RequestsPerS      float64 `json:"requests_per_s"`
	OutputTokensPerS  float64 `json:"output_tokens_per_s"`
	TotalTokensPerS   float64 `json:"total_tokens_per_s"`
	PerRequestTokPerS Dist    `json:"per_request_output_tokens_per_s"`

	TTFT Dist `json:"ttft_ms"`
	ITL  Dist `json:"itl_ms"`
	TPOT Dist `json:"tpot_ms"`
	E2E  Dist `json:"e2e_ms"`

	Errors       map[string]int    `json:"errors"`
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// ErrorCodes counts the failed answers that carried an error code, by
	// kind and code: "http_503 queue_full".
	ErrorCodes map[string]int `json:"error_codes,omitempty"`

	// LoadStartUnixS is when the load clock began (the first phase's start),
	// in Unix seconds: request start offsets and Timeline are relative to
	// it, so that runs of separate bench processes can be lined up.
	LoadStartUnixS float64 `json:"load_start_unix_s"`

	// Timeline is output tokens/s in 1 s buckets of the load clock, from the
	// chunks of every request (completed or not).
	Timeline []float64 `json:"timeline_tokens_per_s"`

	// Turns and LaterTurns (turns ≥ 2 together) break a --sessions run
	// down by turn; absent otherwise.
	Turns      []TurnStats `json:"turns,omitempty"`
	LaterTurns *TurnStats  `json:"later_turns,omitempty"`

	// samples kept for the plot
	ttftSamples []float64
	itlSamples  []float64
}

// summarizeRecords computes the figures of one endpoint from its records.
// dur is its time under load.
func summarizeRecords(s *Summary, recs []record, dur time.Duration) {
	s.Sent = len(recs)
	s.DurationS = dur.Seconds()
	s.Errors = map[string]int{}
	s.ErrorSamples = map[string]string{}
	s.TokensFromUsage = true
	var ttft, itl, tpot, e2e, perReq []float64
	for i := range recs {
		r := &recs[i]
		switch {
		case r.Cancelled:
			s.Cancelled++
			continue
		case r.Err != "":
			s.Failed++
			s.Errors[r.Err]++
			if _, ok := s.ErrorSamples[r.Err]; !ok {
				s.ErrorSamples[r.Err] = r.ErrMsg
			}
			if r.ErrCode != "" {
				if s.ErrorCodes == nil {
					s.ErrorCodes = map[string]int{}
				}
				s.ErrorCodes[r.Err+" "+r.ErrCode]++
			}
			continue
		}
		s.Completed++
		s.InputTokens += r.PromptTokens
		s.CachedTokens += r.CachedTokens
		s.OutputTokens += r.Tokens
		if !r.FromUsage {
			s.TokensFromUsage = false
		}
		t := r.TTFT()
		ttft = append(ttft, ms(t))
		e2e = append(e2e, ms(r.E2E))
		if r.E2E > 0 {
			perReq = append(perReq, float64(r.Tokens)/r.E2E.Seconds())
		}
		itl = appendITLs(itl, r.Chunks)
		if s.Stream && r.Tokens > 1 {
			tpot = append(tpot, ms(r.E2E-t)/float64(r.Tokens-1))
		}
	}
	if s.Completed == 0 {
		s.TokensFromUsage = false
	}
	if sec := dur.Seconds(); sec > 0 {
		s.RequestsPerS = float64(s.Completed) / sec
		s.OutputTokensPerS = float64(s.OutputTokens) / sec
		s.TotalTokensPerS = float64(s.InputTokens+s.OutputTokens) / sec
	}
	s.PerRequestTokPerS = summarize(perReq)
	s.TTFT = summarize(ttft)
	s.ITL = summarize(itl)
	s.TPOT = summarize(tpot)
	s.E2E = summarize(e2e)
	s.ttftSamples, s.itlSamples = ttft, itl
	s.Timeline = timeline(recs, dur)
	if len(s.ErrorSamples) == 0 {
		s.ErrorSamples = nil
	}
}

// timeline buckets output tokens by 1 s of the load clock. A request's tokens
// are spread evenly over its content chunks (servers may send several tokens
// in one chunk); a non-stream request's land at its end.
func timeline(recs []record, dur time.Duration) []float64 {
	n := int(math.Ceil(dur.Seconds()))
	if n < 1 {
		n = 1
	}
	out := make([]float64, n)
	add := func(at time.Duration, v float64) {
		i := int(at / time.Second)
		if i < 0 {
			i = 0
		}
		if i >= n {
			i = n - 1
		}
		out[i] += v
	}
	for i := range recs {
		r := &recs[i]
		if len(r.Chunks) == 0 {
			if r.ok() && r.Tokens > 0 {
				add(r.Start+r.E2E, float64(r.Tokens))
			}
			continue
		}
		per := 1.0
		if r.FromUsage && r.Tokens > 0 {
			per = float64(r.Tokens) / float64(len(r.Chunks))
		}
		for _, c := range r.Chunks {
			add(r.Start+time.Duration(c)*time.Microsecond, per)
		}
	}
	// the last bucket may be partial
	if rem := dur - time.Duration(n-1)*time.Second; rem > 0 && rem < time.Second {
		out[n-1] /= rem.Seconds()
	}
	return out
}

// CompareRow is one metric of a comparison. Diff is target − baseline and is
// only set for latencies; Ratio is target / baseline (0 when baseline is 0).
type CompareRow struct {
	Metric   string   `json:"metric"`
	Unit     string   `json:"unit"`
	Target   float64  `json:"target"`
	Baseline float64  `json:"baseline"`
	Diff     *float64 `json:"diff,omitempty"`
	Ratio    float64  `json:"ratio"`
}

// Comparison is the target-versus-baseline result of a --compare-url run.
type Comparison struct {
	Rows           []CompareRow `json:"rows"`
	AddedTTFTP50ms float64      `json:"added_ttft_p50_ms"` // target − baseline
	AddedTTFTP99ms float64      `json:"added_ttft_p99_ms"`
}

func compare(t, b *Summary) *Comparison {
	c := &Comparison{
		AddedTTFTP50ms: t.TTFT.P50 - b.TTFT.P50,
		AddedTTFTP99ms: t.TTFT.P99 - b.TTFT.P99,
	}
	row := func(metric, unit string, tv, bv float64, latency bool) {
		r := CompareRow{Metric: metric, Unit: unit, Target: tv, Baseline: bv}
		if bv != 0 {
			r.Ratio = tv / bv
		}
		if latency {
			d := tv - bv
			r.Diff = &d
		}
		c.Rows = append(c.Rows, r)
	}
	row("completed", "", float64(t.Completed), float64(b.Completed), false)
	row("failed", "", float64(t.Failed), float64(b.Failed), false)
	row("duration", "s", t.DurationS, b.DurationS, false)
	row("request throughput", "req/s", t.RequestsPerS, b.RequestsPerS, false)
	row("output throughput", "tok/s", t.OutputTokensPerS, b.OutputTokensPerS, false)
	row("per-request output mean", "tok/s", t.PerRequestTokPerS.Mean, b.PerRequestTokPerS.Mean, false)
	for _, m := range []struct {
		name string
		t, b Dist
	}{{"TTFT", t.TTFT, b.TTFT}, {"ITL", t.ITL, b.ITL}, {"TPOT", t.TPOT, b.TPOT}, {"E2E", t.E2E, b.E2E}} {
		row(m.name+" mean", "ms", m.t.Mean, m.b.Mean, true)
		row(m.name+" p50", "ms", m.t.P50, m.b.P50, true)
		row(m.name+" p90", "ms", m.t.P90, m.b.P90, true)
		row(m.name+" p99", "ms", m.t.P99, m.b.P99, true)
		row(m.name+" max", "ms", m.t.Max, m.b.Max, true)
	}
	if t.LaterTurns != nil && b.LaterTurns != nil {
		row("TTFT turns>=2 p50", "ms", t.LaterTurns.TTFT.P50, b.LaterTurns.TTFT.P50, true)
		row("TTFT turns>=2 p99", "ms", t.LaterTurns.TTFT.P99, b.LaterTurns.TTFT.P99, true)
	}
	return c
}

// appendITLs appends to dst the gaps between consecutive chunk arrivals
// (µs after send), in milliseconds.
func appendITLs(dst []float64, chunks []uint32) []float64 {
	for j := 1; j < len(chunks); j++ {
		dst = append(dst, float64(chunks[j]-chunks[j-1])/1000)
	}
	return dst
}
