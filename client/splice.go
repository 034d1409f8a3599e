package client

import (
	"bytes"
	"slices"
	"strconv"

	"github.com/tokenbus/tokenbus/schemas"
)

// splice rewrites a continuation's output into the stream it continues,
// value by value, so that each chunk keeps the engine's key order (nothing
// is decoded and encoded again):
//
//   - each chunk gets the stream's id, created and model (and object);
//   - a text continuation's chat stream drops its opening role chunk (the
//     reader had one);
//   - an exact continuation (a completions stream, continuation.go) of a
//     chat stream becomes chat chunks: each takes the shape of a content
//     chunk the stream had (its keys, their order), with the continuation's
//     text as content, its finish_reason (then stop_reason, where vLLM puts
//     it in a chat stream's last chunk) and its token ids; a stream that had
//     no content chunk yet gets vLLM's;
//   - the continuation's prompt ids (its first chunk) are null, as in every
//     chunk of a stream but its first, and its token ids too unless the
//     reader asked for them (tokenids.go);
//   - usage (a usage chunk, usage on every chunk, the done frame) counts
//     the whole completion: the original prompt (the continuation's prompt
//     less the base tokens it repeats) and every completion token (base
//     plus the continuation's).
//
// Only migrated streams pay for it.
type splice struct {
	// The stream's, as its first chunk wrote them (raw JSON values).
	id, object, created, model []byte
	base                       int  // completion tokens streamed before the continuation
	chat                       bool // the reader's stream is chat
	exact                      bool // the continuation is a completions stream from token ids
	strip                      bool // the reader did not ask for token ids

	tmpl  []byte              // exact chat: the chunk each continuation chunk is made from
	tmplL schemas.ChunkLayout // its layout
	lay   schemas.ChunkLayout // scratch
	edits []edit              // scratch
}

// vllmChatChunk is the shape of a content chunk of vLLM's chat stream (with
// token ids, asked for or not), for a stream that had none yet.
const vllmChatChunk = `{"id":"","object":"chat.completion.chunk","created":0,"model":"","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null,"token_ids":null}]}`

// setTemplate sets the chat chunk continuation chunks are made from: tmpl,
// else vLLM's with the stream's id, created and model.
func (sp *splice) setTemplate(tmpl []byte) {
	if tmpl == nil || schemas.ReadChunkLayout(tmpl, &sp.tmplL) != nil || len(sp.tmplL.Choice) != 1 {
		var l schemas.ChunkLayout
		_ = schemas.ReadChunkLayout([]byte(vllmChatChunk), &l)
		tmpl = applyEdits(nil, []byte(vllmChatChunk), []edit{{l.ID, sp.id}, {l.Created, sp.created}, {l.Model, sp.model}})
		_ = schemas.ReadChunkLayout(tmpl, &sp.tmplL)
	}
	sp.tmpl = tmpl
}

// chunk rewrites a chunk frame's payload; empty: nothing left to send. The
// token ids it carries are recorded in fo first.
func (sp *splice) chunk(fo *failover, payload []byte) []byte {
	out := make([]byte, 0, len(payload)+64)
	_ = schemas.ForEachLine(payload, func(line []byte) error {
		l := &sp.lay
		if len(out) > 0 {
			out = append(out, '\n')
		}
		if schemas.ReadChunkLayout(line, l) != nil {
			out = append(out, line...)
			return nil
		}
		fo.record(line, l)
		if !sp.exact && sp.chat && roleOnly(line, l) || sp.strip && sp.chat && idsOnly(line, l) {
			out = bytes.TrimSuffix(out, []byte{'\n'})
			return nil
		}
		if sp.exact && sp.chat && len(l.Choice) > 0 {
			out = sp.fromCompletion(out, line, l)
			return nil
		}
		edits := sp.edits[:0]
		if l.ID.Has() {
			edits = append(edits, edit{l.ID, sp.id})
		}
		if l.Object.Has() && sp.exact && sp.chat {
			edits = append(edits, edit{l.Object, sp.object})
		}
		if l.Created.Has() {
			edits = append(edits, edit{l.Created, sp.created})
		}
		if l.Model.Has() {
			edits = append(edits, edit{l.Model, sp.model})
		}
		edits = sp.usageEdits(edits, line, l)
		if !l.PromptTokenIDs.Null(line) {
			edits = append(edits, edit{l.PromptTokenIDs, null})
		}
		for i := range l.Choice {
			c := &l.Choice[i]
			if !c.PromptTokenIDs.Null(line) {
				edits = append(edits, edit{c.PromptTokenIDs, null})
			}
			if sp.strip && !c.TokenIDs.Null(line) {
				edits = append(edits, edit{c.TokenIDs, null})
			}
		}
		slices.SortFunc(edits, func(a, b edit) int { return a.at.Start - b.at.Start })
		out = applyEdits(out, line, edits)
		sp.edits = edits[:0]
		return nil
	})
	return out
}

// fromCompletion appends the chat chunk made of the template and the
// completions chunk line (one choice).
func (sp *splice) fromCompletion(out, line []byte, l *schemas.ChunkLayout) []byte {
	c, t := &l.Choice[0], &sp.tmplL.Choice[0]
	edits := sp.edits[:0]
	if t.Content.Has() {
		edits = append(edits, edit{t.Content, orNull(c.Text.In(line))})
	}
	finish := orNull(c.FinishReason.In(line))
	if t.FinishReason.Has() {
		edits = append(edits, edit{t.FinishReason, finish})
		if string(finish) != "null" && !t.StopReason.Has() {
			// vLLM's chat stream names the stop reason in its last chunk only,
			// right after finish_reason.
			at := schemas.Span{Start: t.FinishReason.End, End: t.FinishReason.End}
			edits = append(edits, edit{at, append([]byte(`,"stop_reason":`), orNull(c.StopReason.In(line))...)})
		}
	}
	if t.StopReason.Has() {
		edits = append(edits, edit{t.StopReason, orNull(c.StopReason.In(line))})
	}
	if t.TokenIDs.Has() {
		ids := orNull(c.TokenIDs.In(line))
		if sp.strip {
			ids = null
		}
		edits = append(edits, edit{t.TokenIDs, ids})
	}
	if t.Logprobs.Has() {
		edits = append(edits, edit{t.Logprobs, orNull(c.Logprobs.In(line))})
	}
	if sp.tmplL.Usage.Has() {
		u := null
		if !l.Usage.Null(line) {
			u = applyEdits(nil, line[:l.Usage.End], sp.usageEdits(nil, line, l))[l.Usage.Start:]
		}
		edits = append(edits, edit{sp.tmplL.Usage, u})
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.at.Start - b.at.Start })
	out = applyEdits(out, sp.tmpl, edits)
	sp.edits = edits[:0]
	return out
}

func orNull(v []byte) []byte {
	if len(v) == 0 {
		return null
	}
	return v
}

// usageEdits appends the edits of a chunk's usage object: prompt_tokens
// less the base, completion_tokens plus it, total_tokens their sum.
func (sp *splice) usageEdits(edits []edit, line []byte, l *schemas.ChunkLayout) []edit {
	if l.Usage.Null(line) {
		return edits
	}
	num := func(s schemas.Span) int {
		n, _ := strconv.Atoi(string(s.In(line)))
		return n
	}
	p, c := max(num(l.PromptTokens)-sp.base, 0), num(l.CompletionTokens)+sp.base
	if l.PromptTokens.Has() {
		edits = append(edits, edit{l.PromptTokens, strconv.AppendInt(nil, int64(p), 10)})
	}
	if l.CompletionTokens.Has() {
		edits = append(edits, edit{l.CompletionTokens, strconv.AppendInt(nil, int64(c), 10)})
	}
	if l.TotalTokens.Has() {
		edits = append(edits, edit{l.TotalTokens, strconv.AppendInt(nil, int64(p+c), 10)})
	}
	return edits
}

// done rewrites a done frame's usage.
func (sp *splice) done(payload []byte) []byte {
	l := &sp.lay
	if schemas.ReadChunkLayout(payload, l) != nil || l.Usage.Null(payload) {
		return payload
	}
	edits := sp.usageEdits(sp.edits[:0], payload, l)
	out := applyEdits(make([]byte, 0, len(payload)+8), payload, edits)
	sp.edits = edits[:0]
	return out
}

// roleOnly reports whether a chat chunk's choices only open the assistant
// message (a role and no content, no finish).
func roleOnly(line []byte, l *schemas.ChunkLayout) bool {
	if len(l.Choice) == 0 {
		return false
	}
	for i := range l.Choice {
		c := &l.Choice[i]
		if !c.Role || c.Other || rawString(c.Content.In(line)) != "" || !c.FinishReason.Null(line) {
			return false
		}
	}
	return true
}
