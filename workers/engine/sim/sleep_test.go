package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Sleep mode: asleep, the sim refuses what needs the model with a 503,
// still tokenizes, and has forgotten its prefix cache (and says so in both
// kinds of KV events); a wake-up takes WakeTime and it serves again.
func TestSleepAndWakeUp(t *testing.T) {
	cfg := fastConfig()
	cfg.SleepTime, cfg.WakeTime, cfg.BlockEvents = 0, 40*time.Millisecond, true
	e := newEngine(t, cfg)
	long := `{"model":"sim","max_tokens":2,"ignore_eos":true,"messages":[{"role":"system","content":"` +
		strings.Repeat("tell me more about the weather today please ", 40) + `"}]}`
	mustGen(t, e, schemas.KindChat, long, nil)
	if res := mustGen(t, e, schemas.KindChat, long, nil); res.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("a repeated prompt before the sleep found nothing cached")
	}
	e.DrainKVEvents()
	e.DrainBlockEvents()

	if e.Sleeping() {
		t.Fatal("asleep before Sleep")
	}
	if err := e.Sleep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !e.Sleeping() {
		t.Fatal("awake after Sleep")
	}
	if err := e.Sleep(context.Background()); err != nil {
		t.Fatalf("a second Sleep: %v", err)
	}
	for _, kind := range []schemas.Kind{schemas.KindChat, schemas.KindEmbedding} {
		body := long
		if kind == schemas.KindEmbedding {
			body = `{"model":"sim","input":"hi"}`
		}
		_, err := gen(t, e, kind, body, &recSink{})
		if se := asError(t, err); se.Status != 503 || !schemas.ErrEngineAsleep.Is(se) || !strings.Contains(se.Body.Message, "asleep") {
			t.Fatalf("%s while asleep: %+v", kind, se)
		}
	}
	if _, err := gen(t, e, schemas.KindTokenize, `{"model":"sim","prompt":"hi"}`, nil); err != nil {
		t.Fatalf("tokenize while asleep: %v", err)
	}
	if ev, ok := e.DrainKVEvents(); !ok || ev.Dropped == 0 {
		t.Fatalf("KV events after the sleep: %+v %v; want a loss (the cache was emptied)", ev, ok)
	}
	if evs, _ := e.DrainBlockEvents(); len(evs) != 1 || !evs[0].Cleared {
		t.Fatalf("block events after the sleep: %+v; want AllBlocksCleared", evs)
	}

	start := time.Now()
	if err := e.WakeUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < cfg.WakeTime {
		t.Fatalf("woke in %v, under WakeTime %v", took, cfg.WakeTime)
	}
	if e.Sleeping() {
		t.Fatal("asleep after WakeUp")
	}
	if err := e.WakeUp(context.Background()); err != nil {
		t.Fatalf("a second WakeUp: %v", err)
	}
	if res := mustGen(t, e, schemas.KindChat, long, nil); res.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cached_tokens %d after a sleep: the KV cache was freed", res.Usage.PromptTokensDetails.CachedTokens)
	}
}

// A sleep with a request running is refused (vLLM would abort it: the
// worker never asks for one); a wake-up cut short leaves it asleep.
func TestSleepRefusedWhileBusyAndWakeCutShort(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeBase, cfg.WakeTime = 2*time.Millisecond, time.Hour
	e := newEngine(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.Generate(ctx, &engine.Request{ID: "r", Kind: schemas.KindChat,
			Body: []byte(`{"model":"sim","max_tokens":4000,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`)}, &recSink{})
		done <- err
	}()
	wantStats(t, e, func(st engine.Stats) bool { return st.Running == 1 })
	err := e.Sleep(context.Background())
	if se := asError(t, err); se.Status != 503 || !strings.Contains(se.Body.Message, "requests running (1)") {
		t.Fatalf("Sleep with a request running: %v", err)
	}
	if e.Sleeping() {
		t.Fatal("asleep after a refused Sleep")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request: %v", err)
	}
	if err := e.Sleep(context.Background()); err != nil {
		t.Fatalf("Sleep once idle: %v", err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer wcancel()
	if err := e.WakeUp(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WakeUp cut short: %v", err)
	}
	if !e.Sleeping() {
		t.Fatal("awake after a wake-up cut short")
	}
	if _, err := New(func() Config { c := fastConfig(); c.WakeTime = -1; return c }()); err == nil {
		t.Fatal("a negative WakeTime was accepted")
	}
}

// A switch loads the new model awake: an engine asleep serves again.
func TestSwitchWakes(t *testing.T) {
	cfg := fastConfig()
	cfg.Models, cfg.Model, cfg.SleepTime, cfg.SwitchTime = []string{"a", "b"}, "", 0, 0
	e := newEngine(t, cfg)
	if err := e.Sleep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Switch(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if e.Sleeping() {
		t.Fatal("asleep after a switch")
	}
	mustGen(t, e, schemas.KindChat, `{"model":"b","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
}
