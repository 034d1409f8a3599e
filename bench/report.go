package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
)

// writeReport prints the human-readable report: one block per endpoint, then
// the side-by-side comparison when there is a baseline.
func writeReport(w io.Writer, rep *Report) {
	if rep.Interrupted {
		fmt.Fprintln(w, "*** interrupted: partial results ***")
	}
	for _, s := range rep.Summaries {
		writeSummary(w, s)
	}
	if rep.Compare != nil {
		writeComparison(w, rep)
	}
}

func writeSummary(w io.Writer, s *Summary) {
	mode := "stream"
	if !s.Stream {
		mode = "non-stream"
	}
	fmt.Fprintf(w, "%s\n", banner(fmt.Sprintf(" %s: %s ", s.Name, s.URL)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Model / endpoint:\t%s, %s, %s\n", s.Model, s.Endpoint, mode)
	fmt.Fprintf(tw, "Successful requests:\t%d\n", s.Completed)
	fmt.Fprintf(tw, "Failed requests:\t%d\n", s.Failed)
	if s.Cancelled > 0 {
		fmt.Fprintf(tw, "Cancelled requests:\t%d\n", s.Cancelled)
	}
	fmt.Fprintf(tw, "Benchmark duration (s):\t%.2f\n", s.DurationS)
	fmt.Fprintf(tw, "Total input tokens:\t%d\n", s.InputTokens)
	if s.InputTokens > 0 {
		fmt.Fprintf(tw, "Input tokens from the prefix cache:\t%d (%.1f%%)\n", s.CachedTokens, 100*float64(s.CachedTokens)/float64(s.InputTokens))
	}
	src := "usage"
	if !s.TokensFromUsage {
		src = "counted from content chunks (no usage)"
	}
	fmt.Fprintf(tw, "Total generated tokens:\t%d (%s)\n", s.OutputTokens, src)
	fmt.Fprintf(tw, "Request throughput (req/s):\t%.2f\n", s.RequestsPerS)
	fmt.Fprintf(tw, "Output token throughput (tok/s):\t%.1f\n", s.OutputTokensPerS)
	fmt.Fprintf(tw, "Total token throughput (tok/s):\t%.1f\n", s.TotalTokensPerS)
	tw.Flush()

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-18s\tn\tmean\tp50\tp90\tp99\tmax\t\n", "")
	dist := func(name string, d Dist) {
		name = fmt.Sprintf("%-18s", name)
		if d.N == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t-\t\n", name)
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, d.N, num(d.Mean), num(d.P50), num(d.P90), num(d.P99), num(d.Max))
	}
	dist("TTFT (ms)", s.TTFT)
	if s.Stream {
		dist("ITL (ms)", s.ITL)
		dist("TPOT (ms)", s.TPOT)
	}
	dist("E2E latency (ms)", s.E2E)
	dist("Per-request tok/s", s.PerRequestTokPerS)
	tw.Flush()
	writeTurns(w, s)

	if len(s.Errors) > 0 {
		fmt.Fprintln(w, "Errors:")
		kinds := make([]string, 0, len(s.Errors))
		for k := range s.Errors {
			kinds = append(kinds, k)
		}
		slices.SortFunc(kinds, func(a, b string) int { return s.Errors[b] - s.Errors[a] })
		for _, k := range kinds {
			fmt.Fprintf(w, "  %-32s %6d  e.g. %s\n", k, s.Errors[k], oneLine(s.ErrorSamples[k]))
		}
	}
	fmt.Fprintln(w)
}

// writeTurns prints a --sessions run by turn: TTFT and the share of input
// tokens served from the prefix cache, turn by turn and for turns ≥ 2 (where
// the conversation's history can be reused).
func writeTurns(w io.Writer, s *Summary) {
	if len(s.Turns) == 0 {
		return
	}
	fmt.Fprintln(w, "By turn (TTFT in ms; cached: input tokens from the prefix cache):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-18s\tn\tcached\tmean\tp50\tp90\tp99\tmax\t\n", "")
	row := func(name string, t TurnStats) {
		name = fmt.Sprintf("%-18s", name)
		cached := "-"
		if t.InputTokens > 0 {
			cached = fmt.Sprintf("%.1f%%", 100*float64(t.CachedTokens)/float64(t.InputTokens))
		}
		d := t.TTFT
		if d.N == 0 {
			fmt.Fprintf(tw, "%s\t0\t%s\t-\t-\t-\t-\t-\t\n", name, cached)
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, d.N, cached, num(d.Mean), num(d.P50), num(d.P90), num(d.P99), num(d.Max))
	}
	for _, t := range s.Turns {
		row(fmt.Sprintf("turn %d", t.Turn), t)
	}
	if s.LaterTurns != nil {
		row("turns >= 2", *s.LaterTurns)
	}
	tw.Flush()
}

func writeComparison(w io.Writer, rep *Report) {
	t, b := rep.Summaries[0], rep.Summaries[1]
	c := rep.Compare
	fmt.Fprintln(w, banner(" target vs baseline "))
	fmt.Fprintf(w, "target:   %s (model %s)\nbaseline: %s (model %s)\n", t.URL, t.Model, b.URL, b.Model)
	fmt.Fprintf(w, "same prompts and arrivals in %d interleaved rounds: target then baseline, baseline then target, ...\n", rep.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-32s\ttarget\tbaseline\ttarget-baseline\ttarget/baseline\t\n", "metric")
	for _, r := range c.Rows {
		name := r.Metric
		if r.Unit != "" {
			name += " (" + r.Unit + ")"
		}
		name = fmt.Sprintf("%-32s", name)
		diff, ratio := "", ""
		if r.Diff != nil {
			diff = signed(*r.Diff)
		}
		if r.Baseline != 0 && r.Metric != "completed" && r.Metric != "failed" {
			ratio = fmt.Sprintf("%.3f", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, num(r.Target), num(r.Baseline), diff, ratio)
	}
	tw.Flush()
	fmt.Fprintf(w, "Added TTFT (target - baseline): p50 %s ms, p99 %s ms\n\n", signed(c.AddedTTFTP50ms), signed(c.AddedTTFTP99ms))
}

func banner(title string) string {
	const width = 64
	if len(title) >= width-4 {
		return "==" + title + "=="
	}
	left := (width - len(title)) / 2
	return strings.Repeat("=", left) + title + strings.Repeat("=", width-left-len(title))
}

// num formats a figure with precision suited to its size.
func num(x float64) string {
	switch a := math.Abs(x); {
	case x == math.Trunc(x) && a < 1e9:
		return fmt.Sprintf("%.0f", x)
	case a >= 100:
		return fmt.Sprintf("%.1f", x)
	case a >= 1:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}

func signed(x float64) string {
	s := num(x)
	if x >= 0 {
		s = "+" + s
	}
	return s
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

// RequestJSON is one request in --json with --json-requests.
type RequestJSON struct {
	Endpoint     string    `json:"endpoint"` // target or baseline
	Prompt       int       `json:"prompt"`
	Turn         int       `json:"turn,omitempty"` // --sessions: the session is prompt / turns
	StartS       float64   `json:"start_s"`        // on the endpoint's load clock
	TTFTms       float64   `json:"ttft_ms"`        // with no content chunk (chunks 0): e2e_ms
	Chunks       int       `json:"chunks"`         // content chunks received (a cut request's too)
	E2Ems        float64   `json:"e2e_ms"`
	OutputTokens int       `json:"output_tokens"`
	PromptTokens int       `json:"prompt_tokens"`
	CachedTokens int       `json:"cached_tokens,omitempty"`
	ITLms        []float64 `json:"itl_ms,omitempty"`
	Error        string    `json:"error,omitempty"`
	ErrorMessage string    `json:"error_message,omitempty"`
	ErrorCode    string    `json:"error_code,omitempty"`  // a non-200 answer's error.code
	RetryAfter   string    `json:"retry_after,omitempty"` // a non-200 answer's Retry-After header
	Cancelled    bool      `json:"cancelled,omitempty"`
}

func writeJSON(path string, rep *Report, withRequests bool) error {
	out := struct {
		*Report
		Requests []RequestJSON `json:"requests,omitempty"`
	}{Report: rep}
	if withRequests {
		for i, recs := range rep.requests {
			name := rep.Summaries[i].Name
			for _, r := range recs {
				rj := RequestJSON{
					Endpoint: name, Prompt: r.Prompt, StartS: r.Start.Seconds(),
					TTFTms: ms(r.TTFT()), Chunks: len(r.Chunks), E2Ems: ms(r.E2E), OutputTokens: r.Tokens, PromptTokens: r.PromptTokens,
					Turn: r.Turn, CachedTokens: r.CachedTokens,
					Error: r.Err, ErrorMessage: r.ErrMsg, ErrorCode: r.ErrCode, RetryAfter: r.RetryAfter,
					Cancelled: r.Cancelled,
				}
				rj.ITLms = appendITLs(nil, r.Chunks)
				out.Requests = append(out.Requests, rj)
			}
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
