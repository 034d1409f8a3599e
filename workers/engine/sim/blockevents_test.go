package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// With BlockEvents the sim reports its stores and evictions as vLLM's KV
// events do: chains of token-block hashes with their tokens (the ids
// TokenizeChat gives, as vLLM's /tokenize), evictions by hash.
func TestBlockEvents(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen, cfg.NumBlocks, cfg.BlockEvents = 1024, 100, true
	e := newEngine(t, cfg)
	msgs := func(topic string) string {
		return fmt.Sprintf(`[{"role":"system","content":%q}]`, strings.Repeat(topic+" tell me more about the weather today please ", 60))
	}
	body := func(topic string) string {
		return `{"model":"sim","max_tokens":2,"ignore_eos":true,"messages":` + msgs(topic) + `}`
	}
	mustGen(t, e, schemas.KindChat, body("alpha"), nil)
	evs, dropped := e.DrainBlockEvents()
	if dropped != 0 || len(evs) != 1 || evs[0].Removed || evs[0].Parent != 0 {
		t.Fatalf("after one request: %+v, dropped %d", evs, dropped)
	}
	req, rerr := schemas.ReadRequest(schemas.KindChat, []byte(body("alpha")), "")
	if rerr != nil {
		t.Fatal(rerr)
	}
	ids := e.TokenizeChat(req.Messages, true)
	bs := cfg.BlockSize
	if st := evs[0]; len(st.Hashes) != len(ids)/bs || !slices.Equal(st.Tokens, ids[:len(st.Hashes)*bs]) {
		t.Fatalf("stored %d blocks, %d tokens; want the %d full blocks of the tokenized prompt", len(st.Hashes), len(st.Tokens), len(ids)/bs)
	}
	alpha := evs[0].Hashes
	for _, topic := range []string{"beta", "gamma"} {
		mustGen(t, e, schemas.KindChat, body(topic), nil)
	}
	evs, _ = e.DrainBlockEvents()
	var removed []uint64
	stored := 0
	for _, ev := range evs {
		if ev.Removed {
			removed = append(removed, ev.Hashes...)
		} else {
			stored++
		}
	}
	if stored != 2 || len(removed) == 0 {
		t.Fatalf("after evictions: %d stored, %d removed", stored, len(removed))
	}
	for _, h := range removed {
		if !slices.Contains(alpha, h) {
			t.Fatalf("removed %x is none of alpha's blocks: only alpha's blocks were free to evict", h)
		}
	}
	// A repeat finds its blocks: nothing new stored.
	mustGen(t, e, schemas.KindChat, body("gamma"), nil)
	if evs, _ := e.DrainBlockEvents(); len(evs) != 0 {
		t.Fatalf("repeat: %+v", evs)
	}

	off := fastConfig()
	e2 := newEngine(t, off)
	mustGen(t, e2, schemas.KindChat, body("alpha"), nil)
	if evs, _ := e2.DrainBlockEvents(); len(evs) != 0 {
		t.Fatal("block events without BlockEvents")
	}
}
