package vllm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// vLLM's KV cache events on the wire (vllm/distributed/kv_events.py): a ZMQ
// PUB socket sends multipart messages (topic, 8-byte big-endian sequence
// number, payload), the payload a KVEventBatch encoded by msgspec as
// msgpack. Versions up to late 2025 encode the structs with array_like=True:
//
//	[ts, [event...], data_parallel_rank?]
//	["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size, lora_id|nil, medium|nil, lora_name|nil, ...]
//	["BlockRemoved", block_hashes, medium|nil, ...]
//	["AllBlocksCleared"]
//
// Later ones drop array_like, so the same structs come as maps keyed by
// field name, the tag under "type" ({"type": "BlockStored", "block_hashes":
// ...}), fields at their defaults left out; some keep the batch an array and
// send the events as maps. Each batch and each event is read in whichever
// form it comes. A block hash is bytes or an int (ExternalBlockHash): kept
// opaque. Fields past the known ones (extra_keys, kv_cache_spec_*,
// ownership, session_id, ...) are skipped, events of unknown tags counted
// and skipped; anything malformed is an error, never a panic.
//
// The msgpack itself is read by tinylib/msgp's byte-slice readers, which
// check every value against the bytes left and copy nothing; what they do
// not bound, the element counts of array and map headers (up to 2^32), is
// checked here against the bytes left before anything is allocated, so a
// payload costs memory in proportion to its size whatever it claims, and
// time in proportion to its size (nesting in skipped values is bounded).

type kvEventKind uint8

const (
	kvStored kvEventKind = iota + 1
	kvRemoved
	kvCleared
)

// kvEvent is one event of a batch. Hashes are opaque keys: "i" and the 8
// big-endian bytes of an int hash, "b" and the bytes of a bytes hash.
type kvEvent struct {
	kind      kvEventKind
	hashes    []string
	parent    string // BlockStored: the first block's parent; "": none (a root block)
	tokens    []uint32
	blockSize int    // 0 in the placeholders vLLM's offloading connector sends (medium "CPU", no tokens)
	loraName  string // BlockStored: lora_name ("": none, or a vLLM too old to send it)
	loraID    int64  // BlockStored: lora_id (0: none)
	medium    string // "" (nil): the GPU
	group     int64  // group_idx (0 when absent)
	locality  string // "" (nil) or "LOCAL": this engine's; "REMOTE": another's
}

// kvBatch is one decoded payload.
type kvBatch struct {
	ts      float64
	events  []kvEvent
	unknown int // events with a tag this reader does not know, skipped
}

var errKVWire = errors.New("vLLM KV events: malformed payload")

const (
	// maxKVDepth bounds nesting in values skipped unread (extra_keys
	// holds tuples of anything).
	maxKVDepth = 32
	// maxKVPrealloc bounds the capacity allocated ahead for a list: a
	// longer one grows as its elements are read.
	maxKVPrealloc = 1024
)

// decodeKVBatch decodes one KVEventBatch payload.
func decodeKVBatch(b []byte) (kvBatch, error) {
	d := kvDecoder{all: b, b: b}
	var out kvBatch
	err := d.batch(&out)
	if err == nil && len(d.b) != 0 {
		err = d.fail("bytes after the batch")
	}
	if err != nil {
		return kvBatch{}, err
	}
	return out, nil
}

// kvDecoder walks a payload: b is what is left of all.
type kvDecoder struct {
	all, b []byte
}

func (d *kvDecoder) batch(out *kvBatch) error {
	switch msgp.NextType(d.b) {
	case msgp.ArrayType:
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return d.fail("a batch array of fewer than 2 fields")
		}
		if out.ts, err = d.float(); err != nil {
			return err
		}
		if err := d.events(out); err != nil {
			return err
		}
		for range n - 2 { // data_parallel_rank and anything newer
			if err := d.skip(0); err != nil {
				return err
			}
		}
		return nil
	case msgp.MapType:
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		seen := false
		for range n {
			k, err := d.str()
			if err != nil {
				return err
			}
			switch string(k) {
			case "ts":
				out.ts, err = d.float()
			case "events":
				err, seen = d.events(out), true
			default:
				err = d.skip(0)
			}
			if err != nil {
				return err
			}
		}
		if !seen {
			return d.fail("a batch without events")
		}
		return nil
	}
	return d.fail("a batch is neither an array nor a map")
}

func (d *kvDecoder) events(out *kvBatch) error {
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	out.events = make([]kvEvent, 0, min(n, maxKVPrealloc))
	for range n {
		var ev kvEvent
		switch msgp.NextType(d.b) {
		case msgp.ArrayType:
			err = d.eventArray(&ev)
		case msgp.MapType:
			err = d.eventMap(&ev)
		default:
			err = d.fail("an event is neither an array nor a map")
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

// kvField names an event's field that is read; the rest are skipped.
type kvField uint8

const (
	fSkip kvField = iota
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fGroup
	fLocality
)

var kvFieldNames = map[string]kvField{
	"block_hashes": fHashes, "parent_block_hash": fParent, "token_ids": fTokens, "block_size": fBlockSize,
	"lora_id": fLoraID, "medium": fMedium, "lora_name": fLoraName, "group_idx": fGroup, "locality": fLocality,
}

// kvSchema is an event type's fields: in the order of the array form (after
// the tag), and those every version sends (bit f: field f).
type kvSchema struct {
	kind    kvEventKind
	order   []kvField
	require uint16
}

func fieldSet(fs ...kvField) (s uint16) {
	for _, f := range fs {
		s |= 1 << f
	}
	return s
}

var kvSchemas = map[string]*kvSchema{
	"BlockStored": {kind: kvStored,
		// ..., extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership, session_id
		order: []kvField{fHashes, fParent, fTokens, fBlockSize, fLoraID, fMedium, fLoraName, fSkip, fGroup, fSkip, fSkip, fLocality},
		// parent_block_hash is sent by all, as nil at a root, but
		// not needed.
		require: fieldSet(fHashes, fTokens, fBlockSize)},
	"BlockRemoved": {kind: kvRemoved,
		order:   []kvField{fHashes, fMedium, fGroup, fLocality}, // ..., ownership
		require: fieldSet(fHashes)},
	"AllBlocksCleared": {kind: kvCleared},
}

// String is an event kind's tag, for errors.
func (k kvEventKind) String() string {
	return [...]string{"unknown", "BlockStored", "BlockRemoved", "AllBlocksCleared"}[k]
}

func (d *kvDecoder) eventArray(ev *kvEvent) error {
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return d.fail("an empty event")
	}
	tag, err := d.str()
	if err != nil {
		return err
	}
	s := kvSchemas[string(tag)]
	if s == nil {
		for range n - 1 {
			if err := d.skip(0); err != nil {
				return err
			}
		}
		return nil
	}
	ev.kind = s.kind
	var seen uint16
	for i := range n - 1 {
		f := fSkip
		if i < len(s.order) {
			f = s.order[i]
		}
		if err := d.field(ev, f); err != nil {
			return err
		}
		seen |= 1 << f
	}
	return d.complete(s, seen)
}

func (d *kvDecoder) eventMap(ev *kvEvent) error {
	n, err := d.mapLen()
	if err != nil {
		return err
	}
	var s *kvSchema // the tag's; nil: unknown
	tagged := false
	var seen uint16
	for range n {
		k, err := d.str()
		if err != nil {
			return err
		}
		if string(k) == "type" {
			tag, err := d.str()
			if err != nil {
				return err
			}
			s, tagged = kvSchemas[string(tag)], true
			continue
		}
		f := fSkip
		if !tagged || s != nil { // msgspec writes the tag first: an unknown tag's fields go unread
			f = kvFieldNames[string(k)]
		}
		if err := d.field(ev, f); err != nil {
			return err
		}
		seen |= 1 << f
	}
	if !tagged {
		return d.fail("an event without a type")
	}
	if s == nil {
		return nil
	}
	ev.kind = s.kind
	return d.complete(s, seen)
}

// complete checks that an event has the fields every version sends.
func (d *kvDecoder) complete(s *kvSchema, seen uint16) error {
	if seen&s.require != s.require {
		return d.fail(fmt.Sprintf("a %s event lacks fields", s.kind))
	}
	// A BlockStored whose token ids are not block_size per hash is read
	// anyway (a vLLM that hashes at a finer grain than its blocks would
	// send such; offloading placeholders have none): the mapping decides
	// what it can make of it (kvMap.applyStored).
	return nil
}

// field reads one field of an event into ev.
func (d *kvDecoder) field(ev *kvEvent, f kvField) error {
	var err error
	switch f {
	case fHashes:
		ev.hashes, err = d.hashes()
	case fParent:
		if !d.null() {
			ev.parent, err = d.hash()
		}
	case fTokens:
		ev.tokens, err = d.tokens()
	case fBlockSize:
		var v int64
		v, err = d.int()
		if err == nil && (v < 0 || v > 1<<20) {
			err = d.fail("block_size out of range")
		}
		ev.blockSize = int(v)
	case fLoraID:
		ev.loraID, err = d.optInt()
	case fGroup:
		ev.group, err = d.optInt()
	case fMedium:
		ev.medium, err = d.optStr()
	case fLoraName:
		ev.loraName, err = d.optStr()
	case fLocality:
		ev.locality, err = d.optStr()
	default:
		err = d.skip(0)
	}
	return err
}

func (d *kvDecoder) hashes() ([]string, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	hs := make([]string, 0, min(n, maxKVPrealloc))
	for range n {
		h, err := d.hash()
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, nil
}

// hash reads an ExternalBlockHash: bytes or an int.
func (d *kvDecoder) hash() (string, error) {
	var u uint64
	var rest []byte
	var err error
	switch msgp.NextType(d.b) {
	case msgp.BinType, msgp.StrType:
		b, err := d.str()
		if err != nil {
			return "", err
		}
		return "b" + string(b), nil
	case msgp.UintType:
		u, rest, err = msgp.ReadUint64Bytes(d.b)
	default:
		var i int64
		i, rest, err = msgp.ReadInt64Bytes(d.b)
		u = uint64(i) // a negative int keeps its 64 bits
	}
	if err := d.next(rest, err); err != nil {
		return "", err
	}
	var k [9]byte
	k[0] = 'i'
	binary.BigEndian.PutUint64(k[1:], u)
	return string(k[:]), nil
}

func (d *kvDecoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	ts := make([]uint32, 0, min(n, 16*maxKVPrealloc))
	for range n {
		v, rest, err := msgp.ReadInt64Bytes(d.b)
		if err == nil && (v < 0 || v > math.MaxUint32) {
			return nil, d.fail("a token id out of range")
		}
		if err := d.next(rest, err); err != nil {
			return nil, err
		}
		ts = append(ts, uint32(v))
	}
	return ts, nil
}

// next moves past a value msgp read, or reports its error where it began.
func (d *kvDecoder) next(rest []byte, err error) error {
	if err != nil {
		return fmt.Errorf("%w: %w (at byte %d)", errKVWire, err, len(d.all)-len(d.b))
	}
	d.b = rest
	return nil
}

func (d *kvDecoder) fail(what string) error {
	return fmt.Errorf("%w: %s (at byte %d)", errKVWire, what, len(d.all)-len(d.b))
}

// arrayLen reads an array's header. Every element takes at least a byte:
// a count past the bytes left is an error before anything is allocated.
func (d *kvDecoder) arrayLen() (int, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(d.b)
	if err == nil && uint64(n) > uint64(len(rest)) {
		return 0, d.fail("an array longer than the bytes left")
	}
	return int(n), d.next(rest, err)
}

// mapLen reads a map's header; each entry takes at least two bytes.
func (d *kvDecoder) mapLen() (int, error) {
	n, rest, err := msgp.ReadMapHeaderBytes(d.b)
	if err == nil && 2*uint64(n) > uint64(len(rest)) {
		return 0, d.fail("a map longer than the bytes left")
	}
	return int(n), d.next(rest, err)
}

// str reads a str or bin value, uncopied (it points into the payload).
func (d *kvDecoder) str() ([]byte, error) {
	v, rest, err := msgp.ReadMapKeyZC(d.b)
	return v, d.next(rest, err)
}

// null reads a nil if one is next.
func (d *kvDecoder) null() bool {
	if msgp.IsNil(d.b) {
		d.b = d.b[1:]
		return true
	}
	return false
}

func (d *kvDecoder) optStr() (string, error) {
	if d.null() {
		return "", nil
	}
	v, err := d.str()
	switch string(v) { // the usual values, without an allocation
	case "GPU":
		return "GPU", err
	case "LOCAL":
		return "LOCAL", err
	}
	return string(v), err
}

func (d *kvDecoder) optInt() (int64, error) {
	if d.null() {
		return 0, nil
	}
	return d.int()
}

// int reads an integer that fits in an int64.
func (d *kvDecoder) int() (int64, error) {
	v, rest, err := msgp.ReadInt64Bytes(d.b)
	return v, d.next(rest, err)
}

// float reads a float; msgspec writes a whole float as a float, but an int
// is taken too.
func (d *kvDecoder) float() (float64, error) {
	switch msgp.NextType(d.b) {
	case msgp.IntType, msgp.UintType:
		v, err := d.int()
		return float64(v), err
	}
	v, rest, err := msgp.ReadFloat64Bytes(d.b)
	return v, d.next(rest, err)
}

// skip passes over one value of any type, its nesting bounded (msgp.Skip
// alone would follow it 100000 deep).
func (d *kvDecoder) skip(depth int) error {
	if depth > maxKVDepth {
		return d.fail("nested too deep")
	}
	var n int
	var err error
	switch msgp.NextType(d.b) {
	case msgp.ArrayType:
		n, err = d.arrayLen()
	case msgp.MapType:
		n, err = d.mapLen()
		n *= 2
	default:
		rest, err := msgp.Skip(d.b)
		return d.next(rest, err)
	}
	if err != nil {
		return err
	}
	for range n {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}
