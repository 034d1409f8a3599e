package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/program/chaos"
)

// TestChaosWorkerKill is the short chaos suite of issue 13: kill -9 one of
// three worker processes while 30 streams of 100 tokens run (scripts/chaos
// runs the long one). What already holds is asserted always: the harness
// ran, no stream hangs, no completed stream lost or repeated a token, every
// server error is an OpenAI error object. And the targets: no
// stream fails, every stream has exactly its tokens, a request right after
// the kill succeeds. The stall target (≤ 2 s; 0.8 s measured) is measured by
// scripts/chaos (docs/reliability.md); here the bound is 5 s, so a busy CI
// machine does not fail a test whose target holds with room.
func TestChaosWorkerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: separate processes and a kill -9")
	}
	t.Parallel()
	const streams, tokens, pace = 30, 100, 20 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress strings.Builder
	rep, err := chaos.Run(ctx, chaos.Config{
		Scenarios: []string{"worker"}, Streams: streams, Tokens: tokens, Pace: pace,
		Dir: t.TempDir(), Progress: &progress, Tokenbus: tokenbusBinary(t), NATSServer: natsServer(t),
	})
	if err != nil {
		t.Fatalf("chaos: %v\n%s", err, progress.String())
	}
	var table strings.Builder
	rep.Markdown(&table)
	t.Log("\n" + table.String())
	r := rep.Results[0]
	if r.Err != "" {
		t.Fatalf("scenario did not run: %s\n%s", r.Err, progress.String())
	}

	// Always.
	if r.Streams != streams {
		t.Errorf("%d streams ran, want %d", r.Streams, streams)
	}
	if n := r.Failed["client_timeout"]; n > 0 {
		t.Errorf("%d streams hung past the client's bound", n)
	}
	// Today a dead worker's streams end after the 15 s stall timeout; no
	// stream may take much longer than that plus its own length.
	if bound := (15*time.Second + tokens*pace + 15*time.Second).Seconds(); r.SlowestStream > bound {
		t.Errorf("slowest stream took %.1f s, over %.0f s", r.SlowestStream, bound)
	}
	if r.TokensLost != 0 || r.TokensDuplicated != 0 {
		t.Errorf("streams that completed lost %d and repeated %d tokens: damage must never be silent",
			r.TokensLost, r.TokensDuplicated)
	}
	if r.NotShaped != 0 {
		t.Errorf("%d errors were not OpenAI error objects", r.NotShaped)
	}
	if r.Done+sum(r.Failed) != r.Streams {
		t.Errorf("completed %d + failed %v != %d streams", r.Done, r.Failed, r.Streams)
	}

	// The targets.
	if len(r.Failed) != 0 {
		t.Errorf("failed streams: %v, want none", r.Failed)
	}
	if r.Done != streams || r.WrongLength != 0 {
		t.Errorf("%d streams completed, %d of them not exactly %d tokens", r.Done, r.WrongLength, tokens)
	}
	if r.LongestStall > 5 {
		t.Errorf("longest stall %.2f s, want ≤ 5 s here (the target, 2 s, is measured by scripts/chaos)", r.LongestStall)
	}
	if r.Probe.Result != "ok" {
		t.Errorf("request right after the kill: %s, want ok", r.Probe)
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
