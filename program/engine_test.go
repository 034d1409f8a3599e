package program

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// --engine-kv-events is vLLM's: with another engine it is refused, not ignored.
func TestEngineKVEventsOnlyVLLM(t *testing.T) {
	for _, kind := range []string{"sim", "openai"} {
		c := DefaultEngine()
		c.Kind, c.URL, c.KVEvents = kind, "http://127.0.0.1:1", "tcp://127.0.0.1:5557"
		e, err := newEngine(context.Background(), c, slog.New(slog.DiscardHandler))
		if err == nil {
			e.Close()
			t.Fatalf("%s: --engine-kv-events accepted", kind)
		}
		if !strings.Contains(err.Error(), "--engine-kv-events") {
			t.Errorf("%s: %v", kind, err)
		}
	}
}

// --vllm-model goes instead of --vllm-cmd, as name=command; a sim of
// several models registers them all.
func TestEngineModels(t *testing.T) {
	for _, tc := range []struct {
		cmd    string
		models []string
		want   string
	}{
		{"vllm serve x", []string{"a=vllm serve a"}, "not both"},
		{"", []string{"vllm serve a"}, "not name=command"},
		{"", []string{"a=vllm serve a", "a=vllm serve b"}, "each name once"},
		{"", []string{"a=vllm serve a\na=vllm serve b\n"}, "each name once"}, // TOKENBUS_VLLM_MODEL: one a line
	} {
		c := DefaultEngine()
		c.Kind, c.VLLMCmd, c.VLLMModels = "vllm", tc.cmd, tc.models
		e, err := newEngine(context.Background(), c, slog.New(slog.DiscardHandler))
		if err == nil {
			e.Close()
			t.Fatalf("%q %q accepted", tc.cmd, tc.models)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %q: %v, want %q", tc.cmd, tc.models, err, tc.want)
		}
	}
	c := DefaultEngine()
	c.Sim.Models = []string{"a", "b"}
	e, err := newEngine(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.Models(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("serves %q, want the first of --sim-models", got)
	}
	if got := servable(e); strings.Join(got, ",") != "a,b" {
		t.Fatalf("registers %q", got)
	}
}

// --sleep-after: the openai engine cannot sleep (refused before any wait),
// and a vLLM without its sleep routes is refused at start, saying what it
// lacks.
func TestEngineSleepMode(t *testing.T) {
	c := DefaultEngine()
	c.Kind, c.URL, c.SleepMode = "openai", "http://127.0.0.1:1", true
	if e, err := newEngine(context.Background(), c, slog.New(slog.DiscardHandler)); err == nil {
		e.Close()
		t.Fatal("openai with sleep mode accepted")
	} else if !strings.Contains(err.Error(), "openai engine cannot sleep") {
		t.Errorf("openai: %v", err)
	}

	for _, dev := range []bool{false, true} {
		url := enginetest.SimServer(t, enginetest.SimConfig("llama-8b"), simserver.Config{DevMode: dev, SleepMode: true})
		c = DefaultEngine()
		c.Kind, c.URL, c.SleepMode, c.StartTimeout = "vllm", url, true, 10*time.Second
		c.HealthInterval = 10 * time.Millisecond
		e, err := newEngine(context.Background(), c, slog.New(slog.DiscardHandler))
		if dev {
			if err != nil {
				t.Fatalf("a vLLM with its sleep routes: %v", err)
			}
			e.Close()
			continue
		}
		if err == nil {
			e.Close()
			t.Fatal("a vLLM without its sleep routes accepted")
		}
		if !strings.Contains(err.Error(), "VLLM_SERVER_DEV_MODE=1") {
			t.Errorf("no sleep routes: %v", err)
		}
	}

	c = DefaultEngine()
	c.Kind, c.VLLMModels, c.SleepMode = "vllm", []string{"a=vllm serve a"}, true
	if e, err := newEngine(context.Background(), c, slog.New(slog.DiscardHandler)); err == nil {
		e.Close()
		t.Fatal("--vllm-model with sleep mode accepted")
	} else if !strings.Contains(err.Error(), "--vllm-model") {
		t.Errorf("--vllm-model: %v", err)
	}
}
