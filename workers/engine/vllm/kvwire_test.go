package vllm

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
// (testdata/gen_kvevents.py): the array form of older vLLM and the map form
// of later versions.
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
		// [1.0, [["BlockStored", [1], nil, [1, 2], 0]]]: block_size 0
		{"block size", []byte{0x92, 0x01, 0x91, 0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',
			0x91, 0x01, 0xc0, 0x92, 0x01, 0x02, 0x00}},
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

func FuzzDecodeKVBatch(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.msgpack"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeKVBatch(b)
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
