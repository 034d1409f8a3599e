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
