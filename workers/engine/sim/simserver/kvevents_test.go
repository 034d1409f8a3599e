package simserver

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// The sim-server encodes a batch byte for byte as msgspec encodes vLLM's
// structs (testdata/kv_batch.msgpack, written by workers/engine/vllm/testdata/gen_kvevents.py).
func TestKVBatchEncoding(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("testdata", "kv_batch.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(100000 + i)
	}
	evs := []sim.BlockEvent{
		{Removed: true, Hashes: []uint64{7, 1<<64 - 1}},
		{Hashes: []uint64{1, 2}, Tokens: toks},
		{Hashes: []uint64{3}, Parent: 2, Tokens: slices.Repeat([]uint32{5}, 16), Lora: "sql-lora"},
	}
	got := appendKVBatch(nil, time.Unix(1700000000, 250_000_000), evs, 16)
	if !bytes.Equal(got, want) {
		t.Errorf("encoding differs from msgspec's:\n got  %x\n want %x", got, want)
	}
}

func TestParseKVEventsConfig(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		ep   string
		fail bool
	}{
		{`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","topic":"kv"}`, true, "tcp://*:6000", false},
		{`{"enable_kv_cache_events":true}`, true, "tcp://*:5557", false},
		{`{"enable_kv_cache_events":false,"publisher":"zmq"}`, false, "", false},
		{`{"enable_kv_cache_events":true,"publisher":"null"}`, false, "", false},
		{`{"enable_kv_cache_events":true,"publisher":"kafka"}`, false, "", true},
		{`not json`, false, "", true},
	} {
		kc, ok, err := ParseKVEventsConfig(tc.in)
		if (err != nil) != tc.fail || ok != tc.ok || ok && kc.Endpoint != tc.ep {
			t.Errorf("%s: %+v %v %v", tc.in, kc, ok, err)
		}
	}
}

// A sleep empties the cache: AllBlocksCleared, as msgspec encodes it
// (array_like, no fields: testdata of workers/engine/vllm,
// kv_array_removed_cleared.msgpack, has the same bytes).
func TestKVBatchCleared(t *testing.T) {
	got := appendKVBatch(nil, time.Unix(3, 0), []sim.BlockEvent{{Cleared: true}}, 16)
	want := append([]byte{0x93, 0xcb, 0x40, 0x08, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0}, "AllBlocksCleared"...)
	if !bytes.HasPrefix(got, want) || len(got) != len(want)+1 {
		t.Errorf("encoding %x, want %x and the rank", got, want)
	}
}
