package client

import (
	"bytes"
	"slices"

	"github.com/tokenbus/tokenbus/schemas"
)

// Token ids. A chat or completions stream the client may migrate carries
// schemas.HdrTokenIDs, and an engine that can return token ids (vLLM's
// return_token_ids) asks for them: its chunks then say the ids of the
// prompt (the first chunk) and of each token streamed, which a migration
// continues from exactly (continuation.go). The reader gets the chunks as
// the engine writes them when nobody asked: each array of ids becomes null
// (vLLM writes prompt_token_ids and token_ids as null unasked), and a chat
// chunk that only carried ids (an empty delta, which vLLM sends only when
// asked for ids) is dropped. A request whose body names return_token_ids
// (the client asked, or refused) is left as it is: the engine adds nothing,
// and the client strips nothing.

// idState says whether a stream's chunks carry token ids.
type idState uint8

const (
	idsUnknown idState = iota // no chunk yet
	idsOn                     // the first chunk had the prompt's ids
	idsOff                    // it had none: nothing to record or strip
)

var returnTokenIDs = []byte(`"return_token_ids"`)

// wantsTokenIDs reports whether the client may ask an engine for token ids
// of request r: a stream it may continue, whose body does not name
// return_token_ids. (Whether r streams is the engine's to see: the header
// means nothing to a stream:false request.)
func wantsTokenIDs(r *Request, o *Options) bool {
	return o.MigrationLimit >= 0 && r.Kind.Generates() && !bytes.Contains(r.Body, returnTokenIDs)
}

// edit replaces doc[at.Start:at.End] with with (an insertion when the span
// is empty); a chunk is rewritten by a list of them in document order.
type edit struct {
	at   schemas.Span
	with []byte
}

var null = []byte("null")

// applyEdits appends doc with edits (sorted, not overlapping) to dst.
func applyEdits(dst, doc []byte, edits []edit) []byte {
	r := 0
	for _, e := range edits {
		dst = append(dst, doc[r:e.at.Start]...)
		dst = append(dst, e.with...)
		r = e.at.End
	}
	return append(dst, doc[r:]...)
}

// fits reports whether edits can be applied to doc in place: no edit
// writes past the bytes still to be read.
func fits(edits []edit) bool {
	w, r := 0, 0
	for _, e := range edits {
		w += e.at.Start - r
		if w+len(e.with) > e.at.End && len(e.with) > 0 {
			return false
		}
		w += len(e.with)
		r = e.at.End
	}
	return true
}

// record keeps the ids a chunk carries (prompt: only the first attempt's,
// the original prompt), unless the stream is past the migration's length.
func (fo *failover) record(line []byte, l *schemas.ChunkLayout) {
	if fo.over || fo.badIDs {
		return
	}
	ok := true
	if fo.prompt == nil && fo.sp == nil {
		if l.PromptTokenIDs.Has() && !l.PromptTokenIDs.Null(line) {
			fo.prompt, ok = schemas.AppendTokenIDs(make([]int32, 0, 64), l.PromptTokenIDs.In(line))
		}
		for i := range l.Choice {
			if c := &l.Choice[i]; fo.prompt == nil && !c.PromptTokenIDs.Null(line) {
				fo.prompt, ok = schemas.AppendTokenIDs(make([]int32, 0, 64), c.PromptTokenIDs.In(line))
			}
		}
	}
	for i := range l.Choice {
		if c := &l.Choice[i]; ok && !c.TokenIDs.Null(line) {
			fo.gen, ok = schemas.AppendTokenIDs(fo.gen, c.TokenIDs.In(line))
		}
	}
	if !ok { // ids that are not ids: this stream is continued from its text
		fo.badIDs, fo.prompt, fo.gen = true, nil, nil
	}
}

// idsOnly reports whether a chat chunk carries nothing but token ids: vLLM
// sends a chunk with an empty delta for tokens a parser held back only when
// asked for their ids.
func idsOnly(line []byte, l *schemas.ChunkLayout) bool {
	if len(l.Choice) == 0 || l.Usage.Has() && !l.Usage.Null(line) {
		return false
	}
	for i := range l.Choice {
		c := &l.Choice[i]
		if !c.DeltaEmpty() || !c.FinishReason.Null(line) || !c.Logprobs.Null(line) {
			return false
		}
	}
	return true
}

// stripEdits are the edits that make a chunk what the reader sees unasked:
// its arrays of ids null; drop: leave the chunk out.
func stripEdits(edits []edit, line []byte, l *schemas.ChunkLayout, chat bool) (_ []edit, drop bool) {
	if chat && idsOnly(line, l) {
		return edits, true
	}
	n := len(edits)
	if !l.PromptTokenIDs.Null(line) {
		edits = append(edits, edit{l.PromptTokenIDs, null})
	}
	for i := range l.Choice {
		c := &l.Choice[i]
		if !c.PromptTokenIDs.Null(line) {
			edits = append(edits, edit{c.PromptTokenIDs, null})
		}
		if !c.TokenIDs.Null(line) {
			edits = append(edits, edit{c.TokenIDs, null})
		}
	}
	slices.SortFunc(edits[n:], func(a, b edit) int { return a.at.Start - b.at.Start })
	return edits, false
}

// tokens records the ids of a chunk frame's payload of an unmigrated stream
// and strips them if the reader did not ask: in place when the payload does
// not grow (a message nats.go allocated for this stream alone), in a new
// slice otherwise. Empty: nothing left for the reader.
func (fo *failover) tokens(p []byte, chat bool) []byte {
	first := fo.ids == idsUnknown
	if first && !bytes.Contains(p, []byte(`"prompt_token_ids"`)) {
		fo.ids = idsOff
		return p
	}
	fo.ids = idsOn
	edits := fo.edits[:0]
	for start := 0; start < len(p); {
		end := bytes.IndexByte(p[start:], '\n')
		next := start + end + 1
		if end < 0 {
			end, next = len(p)-start, len(p)
		}
		line := p[start : start+end]
		if e, ok := fo.quick(line, start, edits, chat); ok {
			edits = e
			start = next
			continue
		}
		l := &fo.lay
		if len(line) == 0 || schemas.ReadChunkLayout(line, l) != nil {
			start = next
			continue // not a chunk: passed on as it is
		}
		fo.record(line, l)
		if fo.strip {
			n := len(edits)
			var drop bool
			if edits, drop = stripEdits(edits, line, l, chat); drop {
				at := schemas.Span{Start: start, End: next}
				if next == len(p) && start > 0 && p[start-1] == '\n' {
					at.Start-- // the last chunk: the '\n' before it goes too
				}
				edits = append(edits[:n], edit{at: at})
			} else {
				for i := n; i < len(edits); i++ {
					edits[i].at.Start += start
					edits[i].at.End += start
				}
			}
		}
		start = next
	}
	fo.edits = edits[:0]
	if first && fo.prompt == nil {
		fo.ids = idsOff // no ids after all (null: the engine was not asked)
	}
	if len(edits) == 0 {
		return p
	}
	var out []byte
	if fits(edits) {
		out = applyEdits(p[:0], p, edits)
	} else {
		out = applyEdits(make([]byte, 0, len(p)+4*len(edits)), p, edits)
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil
	}
	return out
}

var idsKey = []byte(`token_ids"`)

// quick records and strips the ids of a chunk without reading it whole:
// it looks for the keys "token_ids" and "prompt_token_ids" (a key's quote
// cannot be a string's: inside a string it is escaped) and reads the
// array after each. This is the per-token path of every vLLM stream: the
// whole reading took a microsecond a chunk, this a quarter of it. ok false
// (nothing done): the line needs the whole reading (a chat delta that may
// carry only ids, or anything unexpected). Edits are at base + offset.
func (fo *failover) quick(line []byte, base int, edits []edit, chat bool) ([]edit, bool) {
	if chat && bytes.Contains(line, []byte(`"delta":{}`)) {
		return edits, false
	}
	type found struct {
		at     schemas.Span
		prompt bool
	}
	var buf [4]found
	ids := buf[:0]
	for off := 0; ; {
		i := bytes.Index(line[off:], idsKey)
		if i < 0 {
			break
		}
		i += off
		off = i + len(idsKey)
		var prompt bool
		switch {
		case i >= 1 && line[i-1] == '"':
		case i >= 8 && string(line[i-8:i]) == `"prompt_`:
			prompt = true
		default:
			continue
		}
		j := skipSpace(line, off)
		if j == len(line) || line[j] != ':' {
			continue // a string "token_ids", not a key
		}
		j = skipSpace(line, j+1)
		switch {
		case bytes.HasPrefix(line[j:], null):
			continue
		case j == len(line) || line[j] != '[':
			return edits, false
		}
		k := bytes.IndexByte(line[j:], ']')
		if k < 0 {
			return edits, false
		}
		ids = append(ids, found{schemas.Span{Start: j, End: j + k + 1}, prompt})
	}
	for _, f := range ids {
		if !fo.over && !fo.badIDs {
			var ok bool
			switch {
			case !f.prompt:
				fo.gen, ok = schemas.AppendTokenIDs(fo.gen, f.at.In(line))
			case fo.prompt == nil:
				fo.prompt, ok = schemas.AppendTokenIDs(make([]int32, 0, 64), f.at.In(line))
			default:
				ok = true
			}
			if !ok {
				fo.badIDs, fo.prompt, fo.gen = true, nil, nil
			}
		}
		if fo.strip {
			edits = append(edits, edit{schemas.Span{Start: base + f.at.Start, End: base + f.at.End}, null})
		}
	}
	return edits, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
