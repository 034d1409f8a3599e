package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

// Markdown writes the report as one table, a row per scenario.
func (rep *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "%s, %s\n\n", rep.Started, rep.Config)
	fmt.Fprintln(w, "| scenario | streams | completed | failed (by code) | retried | migrated | tokens lost | tokens duplicated | longest stall | request after the fault | notes |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rep.Results {
		name := r.Scenario
		if r.Run > 1 {
			name = fmt.Sprintf("%s (run %d)", name, r.Run)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %d | %d | %.2f s | %s | %s |\n",
			name, r.Streams, r.Done, r.failedCell(), opt(r.Retried), opt(r.Migrated),
			r.TokensLost, r.TokensDuplicated, r.LongestStall, r.Probe, r.notesCell())
	}
}

func (r Result) failedCell() string {
	n := 0
	for _, v := range r.Failed {
		n += v
	}
	if n == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Failed)) {
		parts = append(parts, fmt.Sprintf("%d %s", r.Failed[k], k))
	}
	return fmt.Sprintf("%d: %s", n, strings.Join(parts, ", "))
}

func (r Result) notesCell() string {
	var n []string
	if r.Err != "" {
		n = append(n, "**error: "+r.Err+"**")
	}
	if r.FailedAfterFirstToken > 0 {
		n = append(n, fmt.Sprintf("%d failed after their first token, %d tokens undelivered", r.FailedAfterFirstToken, r.TokensUndelivered))
	}
	if r.WrongLength > 0 {
		n = append(n, fmt.Sprintf("%d completed with a wrong length", r.WrongLength))
	}
	if r.NotShaped > 0 {
		n = append(n, fmt.Sprintf("%d errors not OpenAI-shaped", r.NotShaped))
	}
	if r.UsageRecorded != nil {
		n = append(n, fmt.Sprintf("usage: %d of %d completed requests recorded", *r.UsageRecorded, r.Done))
	}
	n = append(n, r.Notes...)
	n = append(n, fmt.Sprintf("slowest stream %.1f s; load %s", r.SlowestStream, r.LoadAvg))
	return strings.Join(n, "; ")
}

func opt(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%g", *v)
}

// WriteJSON writes the report to path.
func (rep *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
