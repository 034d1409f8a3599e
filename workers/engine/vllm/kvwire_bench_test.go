package vllm

import (
	"fmt"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// kvBenchBatch encodes a batch as vLLM sends one engine step's events, with
// msgspec's choices of encoding (smallest ints, str tags): stores BlockStored
// events of blocks blocks each (16 tokens a block, ids near 150000, 64-bit
// int hashes chained by parent), then a BlockRemoved of as many hashes. In
// the map form, the fields of the latest vLLM; else array_like.
func kvBenchBatch(stores, blocks int, maps bool) []byte {
	str, k := msgp.AppendString, func(b []byte, key string) []byte {
		if maps {
			return msgp.AppendString(b, key)
		}
		return b
	}
	head := func(b []byte, n uint32) []byte {
		if maps {
			return msgp.AppendMapHeader(b, n)
		}
		return msgp.AppendArrayHeader(b, n)
	}
	hash := func(i int) uint64 { return uint64(i+1) * 0x9e3779b97f4a7c15 } // 64 bits, high bit set about half the time
	hashes := func(b []byte, from, n int) []byte {
		b = msgp.AppendArrayHeader(b, uint32(n))
		for i := range n {
			b = msgp.AppendUint64(b, hash(from+i))
		}
		return b
	}
	b := head(nil, 3)
	b = msgp.AppendFloat64(k(b, "ts"), 1.7e9)
	b = msgp.AppendArrayHeader(k(b, "events"), uint32(stores+1))
	for s := range stores {
		if maps {
			b = msgp.AppendMapHeader(b, 10)
			b = str(str(b, "type"), "BlockStored")
		} else {
			b = str(msgp.AppendArrayHeader(b, 8), "BlockStored")
		}
		b = hashes(k(b, "block_hashes"), s*blocks, blocks)
		b = msgp.AppendUint64(k(b, "parent_block_hash"), hash(-1))
		b = msgp.AppendArrayHeader(k(b, "token_ids"), uint32(16*blocks))
		for i := range 16 * blocks {
			b = msgp.AppendUint64(b, uint64(150000-i))
		}
		b = msgp.AppendInt(k(b, "block_size"), 16)
		b = msgp.AppendNil(k(b, "lora_id"))
		b = str(k(b, "medium"), "GPU")
		b = msgp.AppendNil(k(b, "lora_name"))
		if maps {
			b = msgp.AppendInt(k(b, "group_idx"), 0)
			b = str(k(b, "kv_cache_spec_kind"), "full_attention")
		}
	}
	if maps {
		b = msgp.AppendMapHeader(b, 4)
		b = str(str(b, "type"), "BlockRemoved")
	} else {
		b = str(msgp.AppendArrayHeader(b, 3), "BlockRemoved")
	}
	b = hashes(k(b, "block_hashes"), 1<<20, stores*blocks)
	b = str(k(b, "medium"), "GPU")
	if maps {
		b = msgp.AppendInt(k(b, "group_idx"), 0)
	}
	return msgp.AppendInt(k(b, "data_parallel_rank"), 0)
}

// BenchmarkDecodeKVBatch decodes batches through msgp (kvwire.go) and
// through the hand-written reader it replaced (kvwire_baseline_test.go), in
// the same run: the ratio of their ns/op is the price of the library. The
// batches: a prefill step's (4 stores of 16 blocks, 1024 tokens, and 64
// blocks evicted) and a decode step's (one block filled, one evicted), in
// both forms. blocks/s counts the blocks stored and removed.
//
//	go test ./workers/engine/vllm -run '^$' -bench DecodeKVBatch -count 5
func BenchmarkDecodeKVBatch(b *testing.B) {
	for _, shape := range []struct {
		name           string
		stores, blocks int
	}{{"prefill", 4, 16}, {"decode", 1, 1}} {
		for _, form := range []string{"array", "map"} {
			payload := kvBenchBatch(shape.stores, shape.blocks, form == "map")
			for _, r := range []struct {
				name   string
				decode func([]byte) (kvBatch, error)
			}{{"msgp", decodeKVBatch}, {"baseline", decodeKVBatchBaseline}} {
				b.Run(fmt.Sprintf("%s/%s/%s", shape.name, form, r.name), func(b *testing.B) {
					if got, err := r.decode(payload); err != nil || len(got.events) != shape.stores+1 {
						b.Fatalf("decoded %d events, err %v", len(got.events), err)
					}
					b.SetBytes(int64(len(payload)))
					b.ReportAllocs()
					for b.Loop() {
						r.decode(payload)
					}
					b.ReportMetric(float64(2*shape.stores*shape.blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
				})
			}
		}
	}
}
