package vllm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// kvPromptFixture is a prompt of 10 text blocks (640 bytes) and 160 tokens:
// 4 bytes a token, so engine block j (16 tokens) is text block j.
func kvPromptFixture(model string) (text []uint64, spanLen int, ids []uint32) {
	span := []byte(strings.Repeat("abcdefgh", 80))
	text = schemas.PromptBlockHashes(nil, model, span, kvBlockBytes)
	return text, len(span), seqTokens(1000, 160)
}

func vhash(i int) string { return fmt.Sprintf("b%02d", i) }

func vhashes(from, n int) []string {
	hs := make([]string, n)
	for i := range hs {
		hs[i] = vhash(from + i)
	}
	return hs
}

// stored is a BlockStored of blocks from..from+n-1 of ids.
func stored(ids []uint32, from, n int, mod func(*kvEvent)) kvEvent {
	ev := kvEvent{kind: kvStored, hashes: vhashes(from, n), tokens: ids[from*16 : (from+n)*16], blockSize: 16}
	if from > 0 {
		ev.parent = vhash(from - 1)
	}
	if mod != nil {
		mod(&ev)
	}
	return ev
}

func TestKVMap(t *testing.T) {
	text, spanLen, ids := kvPromptFixture("m")
	type step struct {
		register string // "-": none; else the prompt registered, with this adapter ("" base: use "base")
		events   []kvEvent
		want     schemas.KVEvents // what a drain after the step returns (BlockBytes filled in)
	}
	reg := func(lora string) step { return step{register: lora} }
	evs := func(e ...kvEvent) step { return step{register: "-", events: e} }
	for _, tc := range []struct {
		name             string
		steps            []step
		mapped, unmapped uint64
	}{
		{"stored then removed", []step{
			reg("base"),
			{register: "-", events: []kvEvent{stored(ids, 0, 10, nil)}, want: schemas.KVEvents{Stored: [][]uint64{text}}},
			{register: "-", events: []kvEvent{{kind: kvRemoved, hashes: []string{vhash(5), "unknown"}}},
				want: schemas.KVEvents{Removed: []uint64{text[5]}}},
		}, 10, 0},
		{"stored before the tokens came", []step{
			evs(stored(ids, 0, 6, nil)),
			{register: "base", want: schemas.KVEvents{Stored: [][]uint64{text[:6]}}},
		}, 0, 6},
		{"stored over two events, one drain", []step{
			reg("base"),
			{register: "-", events: []kvEvent{stored(ids, 0, 4, nil), stored(ids, 4, 6, nil)},
				want: schemas.KVEvents{Stored: [][]uint64{text}}},
		}, 10, 0},
		{"unknown parent", []step{
			reg("base"),
			evs(stored(ids, 3, 4, nil)),
		}, 0, 4},
		{"generated tokens after the prompt", []step{
			reg("base"),
			{register: "-", events: []kvEvent{stored(append(ids[:160:160], seqTokens(7, 32)...), 0, 12, nil)},
				want: schemas.KVEvents{Stored: [][]uint64{text}}},
		}, 10, 2},
		{"all blocks cleared", []step{
			reg("base"),
			{register: "-", events: []kvEvent{stored(ids, 0, 10, nil), {kind: kvCleared}, stored(ids, 0, 3, nil)},
				want: schemas.KVEvents{Stored: [][]uint64{text[:3]}, Dropped: 1}}, // only what came after the loss
			evs(kvEvent{kind: kvRemoved, hashes: []string{vhash(5)}}), // forgotten: nothing
		}, 13, 0},
		{"an adapter's blocks are not the base model's", []step{
			reg("base"),
			evs(stored(ids, 0, 10, func(e *kvEvent) { e.loraName = "sql" })),
		}, 0, 10},
		{"an adapter's blocks", []step{
			reg("sql"),
			{register: "-", events: []kvEvent{stored(ids, 0, 2, func(e *kvEvent) { e.loraName = "sql" })},
				want: schemas.KVEvents{Stored: [][]uint64{text[:2]}}},
		}, 2, 0},
		{"lora_id without lora_name maps nothing", []step{
			reg("sql"),
			evs(stored(ids, 0, 2, func(e *kvEvent) { e.loraID = 1 })),
		}, 0, 2},
		{"other media, groups and localities skipped", []step{
			reg("base"),
			evs(stored(ids, 0, 2, func(e *kvEvent) { e.medium = "CPU" }), stored(ids, 0, 2, func(e *kvEvent) { e.group = 1 }),
				stored(ids, 0, 2, func(e *kvEvent) { e.locality = "REMOTE" })),
		}, 0, 0},
		{"this engine's GPU blocks read", []step{
			reg("base"),
			{register: "-", events: []kvEvent{stored(ids, 0, 2, func(e *kvEvent) { e.medium, e.locality = "GPU", "LOCAL" })},
				want: schemas.KVEvents{Stored: [][]uint64{text[:2]}}},
		}, 2, 0},
		{"tokens that are no whole number per hash", []step{
			reg("base"),
			evs(kvEvent{kind: kvStored, hashes: vhashes(0, 3), tokens: ids[:40], blockSize: 16}),
		}, 0, 3},
		{"another block size starts again", []step{
			reg("base"),
			evs(kvEvent{kind: kvStored, hashes: vhashes(0, 5), tokens: ids, blockSize: 32}),
		}, 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newKVMap(kvBlockBytes)
			for i, s := range tc.steps {
				if s.register != "-" {
					lora := s.register
					if lora == "base" {
						lora = ""
					}
					m.register(text, spanLen, ids, lora)
				}
				m.apply(&kvBatch{events: s.events})
				got, ok := m.drain()
				want := s.want
				if ok != (want.Stored != nil || want.Removed != nil || want.Dropped != 0) {
					t.Fatalf("step %d: drain ok = %v, got %+v", i, ok, got)
				}
				if ok {
					want.BlockBytes = kvBlockBytes
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("step %d: got %+v, want %+v", i, got, want)
					}
				}
			}
			if st := m.statsNow(); st.Mapped != tc.mapped || st.Unmapped != tc.unmapped {
				t.Errorf("mapped %d unmapped %d, want %d %d", st.Mapped, st.Unmapped, tc.mapped, tc.unmapped)
			}
		})
	}
}

// A prompt of fewer bytes per token covers fewer text blocks per engine
// block: the proportional mapping, as the sim's.
func TestKVMapProportional(t *testing.T) {
	text, spanLen, _ := kvPromptFixture("m")
	ids := seqTokens(0, 320) // 2 bytes a token: engine block j starts in text block j/2
	m := newKVMap(kvBlockBytes)
	m.register(text, spanLen, ids, "")
	m.apply(&kvBatch{events: []kvEvent{stored(ids, 0, 5, nil), {kind: kvRemoved, hashes: []string{vhash(3)}}}})
	got, _ := m.drain()
	want := schemas.KVEvents{BlockBytes: kvBlockBytes, Stored: [][]uint64{text[:2]}, Removed: []uint64{text[1]}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if m.known(text[len(text)-1]) != true || m.known(text[0]) {
		t.Error("known: want the last text hash only")
	}
}

func TestKVMapBounded(t *testing.T) {
	m := newKVMap(kvBlockBytes)
	for range maxKVEvents/128 + 1 {
		m.emitStored(make([]uint64, 128)) // distinct prompts, the last past the bound
	}
	m.emitRemoved(1)
	got, _ := m.drain()
	if got.Dropped != 2 || len(got.Stored) != maxKVEvents/128 || len(got.Removed) != 0 {
		t.Errorf("dropped %d, %d chains, %d removed; want 2 dropped past %d hashes", got.Dropped, len(got.Stored), len(got.Removed), maxKVEvents)
	}
}

func TestGen2(t *testing.T) {
	g := newGen2[int, int](4)
	for i := range 10 {
		g.put(i, i)
	}
	if g.len() > 8 {
		t.Fatalf("len %d > 2×max", g.len())
	}
	if _, ok := g.get(0); ok {
		t.Error("the oldest kept")
	}
	if v, ok := g.get(9); !ok || v != 9 {
		t.Error("the newest lost")
	}
	g.del(9)
	if _, ok := g.get(9); ok {
		t.Error("deleted, still there")
	}
}
