package vllm

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

func intKey(v uint64) string {
	var k [9]byte
	k[0] = 'i'
	binary.BigEndian.PutUint64(k[1:], v)
	return string(k[:])
}

func seqTokens(from, n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(from + i)
	}
	return ts
}

// The fixtures are msgspec's own encoding of vLLM's structs
// (testdata/gen_kvevents.py): the array form of older vLLM (down to 0.9's
// five-field BlockStored), the map form of later versions with every field
// they added, and a batch array of map events.
func TestDecodeKVBatchFixtures(t *testing.T) {
	h1, h2 := "b"+strings.Repeat("\x01", 32), "b"+strings.Repeat("\x02", 32)
	m7 := int64(-7)
	minus7 := uint64(m7)
	for _, tc := range []struct {
		file string
		want kvBatch
	}{
		{"kv_array_stored_int.msgpack", kvBatch{ts: 1.5, events: []kvEvent{{
			kind: kvStored, hashes: []string{intKey(minus7), intKey(1<<64 - 1)}, tokens: seqTokens(100, 32),
			blockSize: 16, medium: "GPU"}}}},
		{"kv_array_stored_bytes.msgpack", kvBatch{ts: 2, events: []kvEvent{{
			kind: kvStored, hashes: []string{h2}, parent: h1, tokens: seqTokens(100, 16), blockSize: 16, loraID: 3}}}},
		{"kv_array_removed_cleared.msgpack", kvBatch{ts: 3, unknown: 1, events: []kvEvent{
			{kind: kvRemoved, hashes: []string{h1, intKey(5)}, medium: "GPU"}, {kind: kvCleared}}}},
		{"kv_map_stored.msgpack", kvBatch{ts: 4, unknown: 1, events: []kvEvent{
			{kind: kvStored, hashes: []string{h1, h2}, tokens: seqTokens(100, 32), blockSize: 16, loraName: "sql-lora"},
			{kind: kvRemoved, hashes: []string{h2}, group: 1}}}},
		{"kv_array_v09.msgpack", kvBatch{ts: 5, events: []kvEvent{
			{kind: kvStored, hashes: []string{intKey(11), intKey(12)}, parent: intKey(10), tokens: seqTokens(100, 32), blockSize: 16},
			{kind: kvRemoved, hashes: []string{intKey(10)}}}}},
		{"kv_map_latest.msgpack", kvBatch{ts: 6, events: []kvEvent{
			{kind: kvStored, hashes: []string{h1, h2}, tokens: seqTokens(100, 32), blockSize: 16, loraID: 7, loraName: "sql-lora",
				medium: "GPU", locality: "LOCAL"},
			// The offloading connector's placeholder: read, then skipped by its medium.
			{kind: kvStored, hashes: []string{intKey(5)}, tokens: []uint32{}, medium: "CPU", locality: "LOCAL"},
			{kind: kvStored, hashes: []string{}, tokens: seqTokens(100, 32), blockSize: 16, medium: "GPU", group: 1},
			{kind: kvStored, hashes: []string{intKey(6)}, tokens: seqTokens(100, 16), blockSize: 16, medium: "STORAGE", locality: "REMOTE"},
			{kind: kvRemoved, hashes: []string{h2}, medium: "GPU", locality: "LOCAL"}}}},
		{"kv_array_latest.msgpack", kvBatch{ts: 7, events: []kvEvent{
			{kind: kvStored, hashes: []string{h1}, tokens: seqTokens(100, 16), blockSize: 16, medium: "GPU", locality: "REMOTE"},
			{kind: kvRemoved, hashes: []string{h1}, medium: "GPU", locality: "LOCAL"}}}},
		{"kv_mixed.msgpack", kvBatch{ts: 8, unknown: 1, events: []kvEvent{
			{kind: kvStored, hashes: []string{h1}, tokens: seqTokens(100, 16), blockSize: 16, medium: "GPU"},
			{kind: kvRemoved, hashes: []string{h1}, medium: "GPU"}}}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeKVBatch(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeKVBatchErrors(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "kv_array_stored_int.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated", good[:len(good)-3]},
		{"trailing bytes", append(append([]byte{}, good...), 0xc0)},
		{"not a batch", []byte{0x2a}},
		{"garbage", []byte("\xff\xfe\xc1garbage")},
		{"array of 32 billion", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"batch of one field", []byte{0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}},
		// [1.0, [["BlockStored", [1], nil, [1, 2], -1]]]: block_size -1
		{"block size", []byte{0x92, 0x01, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',
			0x91, 0x01, 0xc0, 0x92, 0x01, 0x02, 0xff}},
		// [1.0, [["BlockStored", [1]]]]: too few fields
		{"too few fields", []byte{0x92, 0x01, 0x91, 0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0x01}},
		// [1.0, [{"block_hashes": []}]]: no type
		{"untagged map event", []byte{0x92, 0x01, 0x91, 0x81, 0xac, 'b', 'l', 'o', 'c', 'k', '_', 'h', 'a', 's', 'h', 'e', 's', 0x90}},
		{"deep nesting", append([]byte{0x93, 0x01, 0x90}, []byte(strings.Repeat("\x91", 100)+"\xc0")...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeKVBatch(tc.b); !errors.Is(err, errKVWire) {
				t.Errorf("err = %v, want errKVWire", err)
			}
		})
	}
}

// hostilePayloads are batches whose headers claim far more than they hold,
// at each level the decoder reads or skips.
var hostilePayloads = []struct {
	name string
	b    []byte
}{
	{"batch array of 4G", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01}},
	{"batch map of 4G", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa2, 't', 's', 0x01}},
	{"events of 4G", []byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90}},
	// [1, [["BlockStored", <4G hashes>...
	{"hashes of 4G", append([]byte{0x92, 0x01, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd'},
		0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02)},
	// [1, [["BlockStored", [], nil, <4G tokens>...
	{"tokens of 4G", append([]byte{0x92, 0x01, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd'},
		0x90, 0xc0, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01)},
	// [1, [["BlockStored", [<4 GB of bytes>]...
	{"a hash of 4 GB", append([]byte{0x92, 0x01, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd'},
		0x91, 0xc6, 0xff, 0xff, 0xff, 0xff, 0x01)},
	{"a skipped str of 4 GB", []byte{0x93, 0x01, 0x90, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}},
	{"a skipped map of 4G", []byte{0x93, 0x01, 0x90, 0xdf, 0xff, 0xff, 0xff, 0xff, 0x01, 0x01}},
	{"a skipped ext of 4 GB", []byte{0x93, 0x01, 0x90, 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}},
	// [1, [{"type": ...: a map event of 4G entries, looked through for its type
	{"map event of 4G", []byte{0x92, 0x01, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xa4, 't', 'y', 'p', 'e'}},
	{"deep", append([]byte{0x93, 0x01, 0x90}, []byte(strings.Repeat("\x91", 1<<16))...)},
}

// A payload's claims are checked against its size before anything is
// allocated: no hostile header costs more than a few kilobytes.
func TestDecodeKVBatchHostileLengths(t *testing.T) {
	for _, tc := range hostilePayloads {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			allocated := testing.AllocsPerRun(1, func() { _, err = decodeKVBatch(tc.b) })
			if !errors.Is(err, errKVWire) {
				t.Fatalf("err = %v, want errKVWire", err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 100 {
				decodeKVBatch(tc.b)
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 16<<10 {
				t.Errorf("%d bytes allocated a decode (%v allocations), want a few kB at most", per, allocated)
			}
		})
	}
}

// The fuzz test feeds any payload to the decoder and the mapping: an
// error or a batch, never a panic, and within the bounds above. It also
// checks the decoder against the hand-written reader it replaced
// (kvwire_baseline_test.go): whatever that one read, this one reads alike;
// it reads more (block_size 0: vLLM's offloading placeholders), never less.
func FuzzDecodeKVBatch(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.msgpack"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, h := range hostilePayloads {
		f.Add(h.b)
	}
	// [1, [{"block_hashes": [1], "type": "Future", "token_ids": [], "type": "BlockRemoved"}]]:
	// a field before the tag, and a second tag (the last counts).
	ev := msgp.AppendArrayHeader(msgp.AppendInt(msgp.AppendArrayHeader(nil, 2), 1), 1)
	ev = msgp.AppendInt(msgp.AppendArrayHeader(msgp.AppendString(msgp.AppendMapHeader(ev, 4), "block_hashes"), 1), 1)
	ev = msgp.AppendString(msgp.AppendString(ev, "type"), "Future")
	ev = msgp.AppendArrayHeader(msgp.AppendString(ev, "token_ids"), 0)
	f.Add(msgp.AppendString(msgp.AppendString(ev, "type"), "BlockRemoved"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeKVBatch(b)
		if want, werr := decodeKVBatchBaseline(b); werr == nil {
			if err != nil {
				t.Fatalf("the baseline reads %+v, the decoder fails: %v", want, err)
			}
			if math.IsNaN(got.ts) && math.IsNaN(want.ts) {
				got.ts, want.ts = 0, 0
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoder  %+v\nbaseline %+v", got, want)
			}
		}
		if err != nil {
			if !errors.Is(err, errKVWire) {
				t.Fatalf("error %v is not errKVWire", err)
			}
			return
		}
		// Whatever was read, mapping it must not panic.
		m := newKVMap(kvBlockBytes)
		text := []uint64{1, 2, 3}
		m.register(text, 192, seqTokens(100, 48), "")
		m.apply(&got)
		m.drain()
	})
}
