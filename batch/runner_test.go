package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/embedded"
	"github.com/tokenbus/tokenbus/internal/testenv"
)

// Finding 10 of issue 32: a runner's work follows the batches that change,
// not every batch ever made. With 1,000 ended batches of other tenants in
// the bucket and none running, an idle runner's NATS connection exchanges
// (almost) nothing over 16 s, past the 15 s at which the old runner
// re-read every record (list the keys, then a get per record: ~3,000
// messages a resync).
func TestIdleRunnerReadsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits 16 s, past the old resync period")
	}
	t.Parallel() // 17 s of watching an idle runner, beside the other tests
	ns := testenv.NATS(t)
	s, err := Open(context.Background(), testenv.Connect(t, ns), Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ended = 1000
	now := time.Now()
	for i := range ended {
		id := newBatchID(now.Add(time.Duration(i) * time.Millisecond))
		exp := now.Add(completionWindow).Unix()
		rec := record{Batch: Batch{ID: id, Object: "batch", Endpoint: "/v1/chat/completions", InputFileID: "file-x",
			CompletionWindow: "24h", Status: StatusCompleted, CreatedAt: now.Unix(), ExpiresAt: &exp,
			RequestCounts: RequestCounts{Total: 10, Completed: 10}}, Tenant: fmt.Sprintf("tenant-%d", i%50)}
		b, _ := json.Marshal(rec)
		if _, err := s.batches.Create(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}

	// The runner on a connection of its own, whose traffic is counted.
	rnc := testenv.Connect(t, ns)
	rs, err := Open(ctx, rnc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := rnc.Stats()
	go func() { done <- NewRunner(rs, nil, RunnerConfig{}).Run(rctx) }()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the runner did not stop")
		}
	}()
	// Its first read of the bucket: every record, once.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if got := rnc.Stats().InMsgs - start.InMsgs; got < ended {
			return fmt.Errorf("%d messages in, want the %d records", got, ended)
		}
		return nil
	})
	time.Sleep(time.Second) // let the first read end: what follows is the steady state
	first := rnc.Stats()
	t.Logf("first read of the bucket: %d messages in, %d out", first.InMsgs-start.InMsgs, first.OutMsgs-start.OutMsgs)

	const window = 16 * time.Second
	time.Sleep(window)
	after := rnc.Stats()
	in, out := after.InMsgs-first.InMsgs, after.OutMsgs-first.OutMsgs
	t.Logf("then over %s with %d ended batches and none running: %d messages in, %d out", window, ended, in, out)
	// The watcher's idle heartbeats (one each 5 s) and little else.
	if in+out > 20 {
		t.Fatalf("an idle runner exchanged %d messages over %s with %d ended batches, want at most 20", in+out, window, ended)
	}
}

// The runner's one watcher of the batches bucket outlives a restart of the
// NATS server (file storage, same port): a batch created after it is seen
// and validated (here: an empty file, which fails at once) within seconds.
// The old runner found it by its 15 s re-read of the bucket; the watcher
// alone (its ordered consumer) took ~20 s to notice its consumer was gone.
func TestRunnerWatchSurvivesNATSRestart(t *testing.T) {
	dir, port := t.TempDir(), testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ns, err := embedded.NATS(addr, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	s, err := Open(ctx, nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- NewRunner(s, nil, RunnerConfig{}).Run(rctx) }()
	defer func() { stop(); <-done }()
	first := batchOf(t, s, "\n")
	waitStatus(t, s, first.ID, StatusFailed)

	ns.Shutdown()
	ns.WaitForShutdown()
	if ns, err = embedded.NATS(addr, dir); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		if !nc.IsConnected() {
			return errors.New("not reconnected")
		}
		return nil
	})
	start := time.Now()
	var second Batch
	testenv.WaitFor(t, 10*time.Second, func() error { // JetStream may still be starting
		f, err := s.PutFile(ctx, "t", "in.jsonl", "batch", strings.NewReader("\n"), 0)
		if err != nil {
			return err
		}
		second, err = s.CreateBatch(ctx, "t", "", CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
		return err
	})
	waitStatus(t, s, second.ID, StatusFailed)
	t.Logf("a batch created after the restart was validated %s later", time.Since(start).Round(time.Millisecond))
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a batch created after the restart waited %s to be validated", d)
	}
}

func waitStatus(t *testing.T, s *Store, id, status string) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, func() error {
		b, err := s.Batch(context.Background(), "t", id)
		if err != nil || b.Status != status {
			return fmt.Errorf("batch %s is %s (%v), want %s", id, b.Status, err, status)
		}
		return nil
	})
}
