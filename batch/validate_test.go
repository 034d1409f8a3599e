package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// Finding 5 of issue 32: a poison input file (100 lines whose model is
// 300 KB of '<', which the key may not use, then more bad lines and a
// custom_id of 2 KB) is reported within bounds: at most 100 errors, at most
// 64 KiB as JSON, each quoting at most 128 bytes of the model. Before,
// every error quoted the whole model: 100 × 300 KB held, and a 180 MB
// record (json.Marshal writes '<' as \u003c) that NATS refused. (Memory is
// measured on a gateway process: TestPoisonBatchMemory.)
func TestValidationBounded(t *testing.T) {
	t.Parallel()
	s := openStore(t, Config{})
	ctx := context.Background()
	file := func() File {
		model := strconv.Quote(strings.Repeat("<", 300_000)) // quoted once: 30 MB through %q is seconds under -race
		var f bytes.Buffer
		fmt.Fprintf(&f, `{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":%s}}`+"\n", strings.Repeat("c", 2000), model)
		for i := range 100 {
			fmt.Fprintf(&f, `{"custom_id":"p-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%s}}`+"\n", i, model)
		}
		for i := range 200 {
			fmt.Fprintf(&f, "not json %d\n", i)
		}
		file, err := s.PutFile(ctx, "t", "poison.jsonl", "batch", &f, 0)
		if err != nil {
			t.Fatal(err)
		}
		return file
	}()
	c, err := s.check(ctx, record{Batch: Batch{ID: "batch_x", InputFileID: file.ID, Endpoint: "/v1/chat/completions"}},
		func(string) (bool, error) { return false, nil })
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(c.errs)
	t.Logf("a %d-byte poison file: %d errors, %d bytes as JSON", file.Bytes, len(c.errs), len(b))
	if len(c.errs) > maxReported || len(b) > maxErrorsBytes {
		t.Fatalf("%d errors, %d bytes: over the bounds (%d, %d)", len(c.errs), len(b), maxReported, maxErrorsBytes)
	}
	if c.errs[0].Code != "invalid_value" || *c.errs[0].Param != "custom_id" {
		t.Fatalf("a 2,000-byte custom_id: %+v", c.errs[0])
	}
	for _, e := range c.errs[1:] {
		if e.Code != "model_not_allowed" || len(e.Message) > 256 || !strings.Contains(e.Message, "… (300000 bytes)") {
			t.Fatalf("error %+v (%d bytes)", e, len(e.Message))
		}
	}
}

// A value quoted by an error is cut at a character boundary.
func TestQuote(t *testing.T) {
	if got := quote("llama-8b"); got != "llama-8b" {
		t.Fatalf("a short value: %q", got)
	}
	long := strings.Repeat("é", 100) // 200 bytes, two per character
	got := quote("x" + long)         // a character starts at odd offsets: 128 is inside one
	if !strings.HasPrefix(got, "x"+strings.Repeat("é", 63)+"…") || !strings.HasSuffix(got, "(201 bytes)") {
		t.Fatalf("%q", got)
	}
}

// batchOf creates a batch of tenant "t" on content, validating.
func batchOf(t *testing.T, s *Store, content string) Batch {
	t.Helper()
	ctx := context.Background()
	f, err := s.PutFile(ctx, "t", "in.jsonl", "batch", strings.NewReader(content), 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBatch(ctx, "t", "key_1", CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A validation that outlasts ValidationTimeout fails the batch with
// validation_timeout and leaves no line queued.
func TestValidationTimeout(t *testing.T) {
	s := openStore(t, Config{})
	ctx := context.Background()
	var f strings.Builder
	for i := range 20_000 {
		f.WriteString(line(fmt.Sprint(i)) + "\n")
	}
	b := batchOf(t, s, f.String())
	r := NewRunner(s, nil, RunnerConfig{ValidationTimeout: time.Millisecond, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	rec, _, err := s.get(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	r.note(rec) // as the runner's watcher would
	r.validate(ctx, b.ID)
	got, err := s.Batch(ctx, "t", b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusFailed || got.Errors == nil || got.Errors.Data[0].Code != "validation_timeout" || got.FailedAt == nil {
		t.Fatalf("after a validation past its limit: %s %+v", got.Status, got.Errors)
	}
	info, err := s.work.Info(ctx, jetstream.WithSubjectFilter(WorkPrefix+b.ID))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[WorkPrefix+b.ID]; n != 0 {
		t.Fatalf("%d lines of the failed batch still queued", n)
	}
}

// A cancel reaches a validation under way at once: it stops, and the batch
// ends cancelled (here the validation waits on the key's model check).
func TestCancelStopsValidation(t *testing.T) {
	s := openStore(t, Config{})
	ctx := context.Background()
	b := batchOf(t, s, line("a")+"\n")
	asked := make(chan struct{}, 1)
	stopped := make(chan error, 1)
	r := NewRunner(s, nil, RunnerConfig{ModelAllowed: func(ctx context.Context, _, _ string) (bool, error) {
		asked <- struct{}{}
		<-ctx.Done() // never answers: only the cancel ends it
		stopped <- context.Cause(ctx)
		return false, ctx.Err()
	}})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { stop(); <-done }()
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the validation did not begin")
	}
	if c, err := s.CancelBatch(ctx, "t", b.ID); err != nil || c.Status != StatusCancelling {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	select {
	case why := <-stopped:
		if why != errCancelled {
			t.Fatalf("the validation stopped for %v", why)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancel did not stop the validation")
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		got, err := s.Batch(ctx, "t", b.ID)
		if err != nil || got.Status != StatusCancelled || got.CancelledAt == nil {
			return fmt.Errorf("batch %s %v", got.Status, err)
		}
		return nil
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
