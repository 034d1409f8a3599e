package program

import (
	"context"
	"log/slog"
	"strings"
	"testing"
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
