package vllm

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The hand-written msgpack reader kvwire.go had before it read through
// tinylib/msgp, kept as the baseline of BenchmarkDecodeKVBatch and the
// reference FuzzDecodeKVBatch compares the decoder with; unchanged but for
// its name and locality, a field vLLM added since, read so that the two
// can be compared field for field. Not built into the program.

// decodeKVBatchBaseline decodes one KVEventBatch payload.
func decodeKVBatchBaseline(b []byte) (kvBatch, error) {
	r := mpReader{b: b}
	var out kvBatch
	var err error
	switch c := r.peek(); {
	case isArray(c):
		err = r.batchArray(&out)
	case isMap(c):
		err = r.batchMap(&out)
	default:
		err = r.fail("a batch is neither an array nor a map")
	}
	if err != nil {
		return kvBatch{}, err
	}
	if r.p != len(b) {
		return kvBatch{}, r.fail("bytes after the batch")
	}
	return out, nil
}

func (r *mpReader) batchArray(out *kvBatch) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return r.fail("a batch array of fewer than 2 fields")
	}
	if out.ts, err = r.float(); err != nil {
		return err
	}
	if err := r.events(out); err != nil {
		return err
	}
	for range n - 2 { // data_parallel_rank and anything newer
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func (r *mpReader) batchMap(out *kvBatch) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	seen := false
	for range n {
		k, err := r.str()
		if err != nil {
			return err
		}
		switch k {
		case "ts":
			out.ts, err = r.float()
		case "events":
			err, seen = r.events(out), true
		default:
			err = r.skip(0)
		}
		if err != nil {
			return err
		}
	}
	if !seen {
		return r.fail("a batch without events")
	}
	return nil
}

func (r *mpReader) events(out *kvBatch) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	out.events = make([]kvEvent, 0, n)
	for range n {
		var ev kvEvent
		switch c := r.peek(); {
		case isArray(c):
			err = r.eventArray(&ev)
		case isMap(c):
			err = r.eventMap(&ev)
		default:
			err = r.fail("an event is neither an array nor a map")
		}
		if err != nil {
			return err
		}
		if ev.kind == 0 {
			out.unknown++
			continue
		}
		out.events = append(out.events, ev)
	}
	return nil
}

// Field order of the array form, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "", "", "locality"}
	removedFields = []string{"block_hashes", "medium", "group_idx", "locality"}
)

func kindOf(tag string) (kvEventKind, []string) {
	switch tag {
	case "BlockStored":
		return kvStored, storedFields
	case "BlockRemoved":
		return kvRemoved, removedFields
	case "AllBlocksCleared":
		return kvCleared, nil
	}
	return 0, nil
}

func (r *mpReader) eventArray(ev *kvEvent) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return r.fail("an empty event")
	}
	tag, err := r.str()
	if err != nil {
		return err
	}
	kind, fields := kindOf(tag)
	ev.kind = kind
	for i := 1; i < n; i++ {
		name := ""
		if kind != 0 && i-1 < len(fields) {
			name = fields[i-1]
		}
		if err := r.field(ev, name); err != nil {
			return err
		}
	}
	need := 0
	switch kind {
	case kvStored:
		need = 4 // block_hashes, parent_block_hash, token_ids, block_size: in every version
	case kvRemoved:
		need = 1
	}
	return ev.check(n-1 >= need)
}

func (r *mpReader) eventMap(ev *kvEvent) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	var kind kvEventKind
	tagged := false
	var names []string
	for range n {
		k, err := r.str()
		if err != nil {
			return err
		}
		if k == "type" {
			tag, err := r.str()
			if err != nil {
				return err
			}
			kind, _ = kindOf(tag)
			tagged = true
			continue
		}
		if tagged && kind == 0 { // msgspec writes the tag first
			k = ""
		}
		if err := r.field(ev, k); err != nil {
			return err
		}
		names = append(names, k)
	}
	if !tagged {
		return r.fail("an event without a type")
	}
	ev.kind = kind
	if kind == 0 {
		return nil
	}
	has := func(s string) bool {
		for _, x := range names {
			if x == s {
				return true
			}
		}
		return false
	}
	switch kind {
	case kvStored:
		return ev.check(has("block_hashes") && has("token_ids") && has("block_size"))
	case kvRemoved:
		return ev.check(has("block_hashes"))
	}
	return nil
}

// check validates what an event needs once its fields are read.
func (ev *kvEvent) check(complete bool) error {
	if ev.kind == 0 {
		return nil
	}
	if !complete {
		return fmt.Errorf("%w: a %s event lacks fields", errKVWire, ev.kindName())
	}
	// A BlockStored whose token ids are not block_size per hash is read
	// anyway (a vLLM that hashes at a finer grain than its blocks would send
	// such): the mapping decides what it can make of it (kvMap.applyStored).
	return nil
}

func (ev *kvEvent) kindName() string {
	return [...]string{"unknown", "BlockStored", "BlockRemoved", "AllBlocksCleared"}[ev.kind]
}

// field reads one field of an event into ev by its name ("": skip it).
func (r *mpReader) field(ev *kvEvent, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.hashes, err = r.hashes()
	case "parent_block_hash":
		if !r.null() {
			ev.parent, err = r.hash()
		}
	case "token_ids":
		ev.tokens, err = r.tokens()
	case "block_size":
		var v int64
		v, err = r.int()
		if err == nil && (v <= 0 || v > 1<<20) {
			err = r.fail("block_size out of range")
		}
		ev.blockSize = int(v)
	case "lora_id":
		ev.loraID, err = r.optInt()
	case "group_idx":
		ev.group, err = r.optInt()
	case "medium":
		ev.medium, err = r.optStr()
	case "lora_name":
		ev.loraName, err = r.optStr()
	case "locality":
		ev.locality, err = r.optStr()
	default:
		err = r.skip(0)
	}
	return err
}

func (r *mpReader) hashes() ([]string, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	hs := make([]string, n)
	for i := range hs {
		if hs[i], err = r.hash(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// hash reads an ExternalBlockHash: bytes or an int.
func (r *mpReader) hash() (string, error) {
	c := r.peek()
	if c == 0xc4 || c == 0xc5 || c == 0xc6 || c>>5 == 0x5 || c == 0xd9 || c == 0xda || c == 0xdb {
		b, err := r.raw()
		if err != nil {
			return "", err
		}
		return "b" + string(b), nil
	}
	u, err := r.uintBits()
	if err != nil {
		return "", err
	}
	var k [9]byte
	k[0] = 'i'
	binary.BigEndian.PutUint64(k[1:], u)
	return string(k[:]), nil
}

func (r *mpReader) tokens() ([]uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	ts := make([]uint32, n)
	for i := range ts {
		v, err := r.int()
		if err != nil {
			return nil, err
		}
		if v < 0 || v > math.MaxUint32 {
			return nil, r.fail("a token id out of range")
		}
		ts[i] = uint32(v)
	}
	return ts, nil
}

// mpReader reads msgpack values from b, bounds-checked.
type mpReader struct {
	b []byte
	p int
}

func (r *mpReader) fail(what string) error {
	return fmt.Errorf("%w: %s (at byte %d)", errKVWire, what, r.p)
}

func isArray(c byte) bool { return c>>4 == 0x9 || c == 0xdc || c == 0xdd }
func isMap(c byte) bool   { return c>>4 == 0x8 || c == 0xde || c == 0xdf }

// peek is the next type byte; 0xc1 (never used by msgpack) at the end.
func (r *mpReader) peek() byte {
	if r.p >= len(r.b) {
		return 0xc1
	}
	return r.b[r.p]
}

func (r *mpReader) next(n int) ([]byte, error) {
	if n < 0 || len(r.b)-r.p < n {
		return nil, r.fail("truncated")
	}
	s := r.b[r.p : r.p+n]
	r.p += n
	return s, nil
}

func (r *mpReader) byte1() (byte, error) {
	s, err := r.next(1)
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

// length reads a big-endian length of size bytes.
func (r *mpReader) length(size int) (int, error) {
	s, err := r.next(size)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range s {
		n = n<<8 | uint64(c)
	}
	if n > uint64(len(r.b)-r.p) { // every element or byte takes at least one byte
		return 0, r.fail("a length past the end")
	}
	return int(n), nil
}

func (r *mpReader) arrayLen() (int, error) { return r.containerLen(0x9, 0xdc, 0xdd, "not an array") }

func (r *mpReader) mapLen() (int, error) { return r.containerLen(0x8, 0xde, 0xdf, "not a map") }

// containerLen reads an array's or a map's header: fix is the high nibble
// of its fix form, c16 and c32 the type bytes of its 16- and 32-bit forms.
func (r *mpReader) containerLen(fix, c16, c32 byte, what string) (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c>>4 == fix:
		return int(c & 0x0f), nil
	case c == c16:
		return r.length(2)
	case c == c32:
		return r.length(4)
	}
	r.p--
	return 0, r.fail(what)
}

// raw reads a str or bin value's bytes.
func (r *mpReader) raw() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c>>5 == 0x5:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.length(1)
	case c == 0xda || c == 0xc5:
		n, err = r.length(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.length(4)
	default:
		r.p--
		return nil, r.fail("not a string or bytes")
	}
	if err != nil {
		return nil, err
	}
	return r.next(n)
}

func (r *mpReader) str() (string, error) {
	b, err := r.raw()
	return string(b), err
}

// null reads a nil if one is next.
func (r *mpReader) null() bool {
	if r.peek() == 0xc0 {
		r.p++
		return true
	}
	return false
}

func (r *mpReader) optStr() (string, error) {
	if r.null() {
		return "", nil
	}
	return r.str()
}

func (r *mpReader) optInt() (int64, error) {
	if r.null() {
		return 0, nil
	}
	return r.int()
}

// uintBits reads any integer as its 64 bits (a uint64 past MaxInt64 kept).
func (r *mpReader) uintBits() (uint64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), nil
	}
	size := map[byte]int{0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8}[c]
	if size == 0 {
		r.p--
		return 0, r.fail("not an integer")
	}
	s, err := r.next(size)
	if err != nil {
		return 0, err
	}
	var u uint64
	for _, b := range s {
		u = u<<8 | uint64(b)
	}
	if c >= 0xd0 { // signed: extend
		shift := 64 - 8*size
		u = uint64(int64(u<<shift) >> shift)
	}
	return u, nil
}

// int reads an integer that fits in an int64.
func (r *mpReader) int() (int64, error) {
	c := r.peek()
	u, err := r.uintBits()
	if err != nil {
		return 0, err
	}
	if c == 0xcf && u > math.MaxInt64 {
		return 0, r.fail("an integer past int64")
	}
	return int64(u), nil
}

func (r *mpReader) float() (float64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		s, err := r.next(4)
		if err != nil {
			return 0, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(s))), nil
	case 0xcb:
		s, err := r.next(8)
		if err != nil {
			return 0, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(s)), nil
	}
	r.p--
	v, err := r.int() // msgspec writes a whole float as a float; tolerate an int
	return float64(v), err
}

// skip passes over one value of any type.
func (r *mpReader) skip(depth int) error {
	if depth > maxKVDepth {
		return r.fail("nested too deep")
	}
	c := r.peek()
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.p++
		return nil
	case c>>5 == 0x5 || c == 0xc4 || c == 0xc5 || c == 0xc6 || c == 0xd9 || c == 0xda || c == 0xdb:
		_, err := r.raw()
		return err
	case c >= 0xcc && c <= 0xd3:
		_, err := r.uintBits()
		return err
	case c == 0xca || c == 0xcb:
		_, err := r.float()
		return err
	case isArray(c) || isMap(c):
		var n int
		var err error
		if isArray(c) {
			n, err = r.arrayLen()
		} else {
			n, err = r.mapLen()
			n *= 2
		}
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16
		r.p++
		_, err := r.next(1 + 1<<(c-0xd4))
		return err
	case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext 8, 16, 32
		r.p++
		n, err := r.length(1 << (c - 0xc7))
		if err != nil {
			return err
		}
		_, err = r.next(1 + n)
		return err
	}
	return r.fail("not a msgpack value")
}
