package workers

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func TestPrefixPredictionCompare(t *testing.T) {
	details := func(cached int) *schemas.TokenDetails { return &schemas.TokenDetails{CachedTokens: cached} }
	tests := []struct {
		name      string
		header    string
		usage     schemas.Usage
		estimated bool
		want      prefixComparison
	}{
		{"all cached", "960/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, false, prefixComparison{240, 240, true}},
		{"none predicted, some found", "0/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(32)}, false, prefixComparison{0, 32, true}},
		{"predicted, evicted", "500/1000", schemas.Usage{PromptTokens: 101, PromptTokensDetails: details(0)}, false, prefixComparison{51, 0, true}}, // 50.5 rounds up
		{"engine reports no cached tokens", "960/1000", schemas.Usage{PromptTokens: 250}, false, prefixComparison{}},
		{"usage estimated", "960/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, true, prefixComparison{}},
		{"no prediction (routed by load)", "", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, false, prefixComparison{}},
		{"malformed header", "x/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, false, prefixComparison{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := nats.Header{}
			if tt.header != "" {
				h.Set(schemas.HdrPrefixCached, tt.header)
			}
			if got := readPrefixPrediction(h).compare(&tt.usage, tt.estimated); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// usageEngine answers every request at once with one chunk and fixed usage.
type usageEngine struct {
	gateEngine
	usage schemas.Usage
}

func (e *usageEngine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	if err := sink.Chunks([]byte(`{"n":1}`)); err != nil {
		return nil, err
	}
	return &engine.Result{Usage: e.usage}, nil
}

// Through NATS: a request with a prediction ends with both figures in the
// metrics, on its span and in its debug log line; one without is not counted.
func TestPrefixComparisonRecorded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	uninstall := tracing.Install(tp)
	t.Cleanup(func() { uninstall(); _ = tp.Shutdown(context.Background()) })
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &usageEngine{usage: schemas.Usage{PromptTokens: 200, CompletionTokens: 1, PromptTokensDetails: &schemas.TokenDetails{CachedTokens: 96}}}
	w, _, _ := startWorkerLog(t, nc, eng, Config{ID: "w1", MaxConcurrency: 4}, log)

	withPred := send(t, nc, schemas.WorkSubject("w1"), "with", map[string]string{schemas.HdrPrefixCached: "500/1000"})
	testenv.WaitFor(t, 2*time.Second, wantTypes(withPred, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	without := send(t, nc, schemas.WorkSubject("w1"), "without", nil)
	testenv.WaitFor(t, 2*time.Second, wantTypes(without, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	testenv.WaitFor(t, 2*time.Second, func() error { // spans end after the last frame
		if n := len(rec.Ended()); n < 2 {
			return fmt.Errorf("%d spans ended", n)
		}
		return nil
	})

	m := &w.m.prefix
	if p, a := read(t, m.predicted).GetCounter().GetValue(), read(t, m.actual).GetCounter().GetValue(); p != 100 || a != 96 {
		t.Errorf("counted predicted %v, actual %v; want 100 and 96 (the request without a prediction not counted)", p, a)
	}
	if h := read(t, m.diff).GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != -4 {
		t.Errorf("difference histogram: %d samples, sum %v; want 1 of -4", h.GetSampleCount(), h.GetSampleSum())
	}
	for _, s := range rec.Ended() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		pred, okP := attrs[tracing.AttrPrefixPredicted]
		act, okA := attrs[tracing.AttrPrefixCached]
		switch attrs[tracing.AttrRequestID] {
		case "with":
			if pred != "100" || act != "96" {
				t.Errorf("span with a prediction: predicted %q, cached %q", pred, act)
			}
		case "without":
			if okP || okA {
				t.Errorf("span without a prediction has %q, %q", pred, act)
			}
		}
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "request_id=with ") {
				if !strings.Contains(line, "cached_tokens_predicted=100 cached_tokens=96") {
					return fmt.Errorf("log line %q", line)
				}
				return nil
			}
		}
		return fmt.Errorf("no log line for the request in %q", logs.String())
	})
	if regexp.MustCompile(`request_id=without [^\n]*cached_tokens`).MatchString(logs.String()) {
		t.Error("log line of the request without a prediction has cached tokens")
	}
}

func read(t *testing.T, c prometheus.Metric) *dto.Metric {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return &m
}
