package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// The sim names the blocks it stores and evicts as a dispatcher hashes the
// same request's prompt, so that a dispatcher can look them up.
func TestKVEvents(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen, cfg.NumBlocks = 1024, 100 // 1600 tokens: two long prompts at most
	e := newEngine(t, cfg)
	body := func(topic string) string {
		return fmt.Sprintf(`{"model":"sim","max_tokens":2,"ignore_eos":true,"messages":[{"role":"system","content":%q}]}`,
			strings.Repeat(topic+" tell me more about the weather today please ", 60))
	}
	textOf := func(b string) []uint64 {
		return schemas.PromptBlockHashes(nil, "sim", schemas.PromptSpan([]byte(b)), 64)
	}
	a := body("alpha")
	mustGen(t, e, schemas.KindChat, a, nil)
	ev, ok := e.DrainKVEvents()
	if !ok || ev.BlockBytes != 64 || len(ev.Stored) != 1 {
		t.Fatalf("after one request: %+v %v", ev, ok)
	}
	full := textOf(a)
	if got := ev.Stored[0]; len(got) < len(full)-2 || !slices.Equal(got, full[:len(got)]) {
		t.Fatalf("stored %d blocks, want the first %d-%d of the dispatcher's hashes in order", len(got), len(full)-2, len(full))
	}
	if _, ok := e.DrainKVEvents(); ok {
		t.Fatal("events drained twice")
	}
	// Two more long prompts push alpha's blocks out of the cache.
	for _, topic := range []string{"beta", "gamma"} {
		mustGen(t, e, schemas.KindChat, body(topic), nil)
	}
	ev, ok = e.DrainKVEvents()
	if !ok || len(ev.Stored) != 2 || len(ev.Removed) == 0 {
		t.Fatalf("after evictions: %d stored, %d removed", len(ev.Stored), len(ev.Removed))
	}
	for _, h := range ev.Removed {
		if !slices.Contains(full, h) {
			t.Fatalf("removed %x is none of alpha's blocks: only alpha's blocks were free to evict", h)
		}
	}
	// A repeated prompt is stored (found again) once more; an adapter-free
	// engine names it by the model the request asked for.
	mustGen(t, e, schemas.KindChat, body("gamma"), nil)
	if ev, _ := e.DrainKVEvents(); len(ev.Stored) != 1 || ev.Stored[0][0] != textOf(body("gamma"))[0] {
		t.Fatalf("repeat: %+v", ev)
	}

	off := fastConfig()
	off.KVEventBytes = -1
	e2 := newEngine(t, off)
	mustGen(t, e2, schemas.KindChat, a, nil)
	if _, ok := e2.DrainKVEvents(); ok {
		t.Fatal("events with KVEventBytes < 0")
	}
}
