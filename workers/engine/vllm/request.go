package vllm

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// What the engine adds to a request before it goes to vLLM; otherwise the
// body passes byte for byte.
//
//   - return_token_ids: true, on a chat or completions stream whose
//     requester takes token ids it did not ask for (Request.TokenIDs, set by
//     the client package, which strips them before its reader sees them),
//     unless the body names return_token_ids itself (asked, or refused: the
//     client's choice stands). With the ids of the prompt and of every token
//     streamed, a stream whose worker fails is continued exactly: from those
//     ids, not from its text tokenized again (docs/migration.md).
//   - max_tokens, on such a continuation (Request.Resume > 0: a completions
//     request with a token-id prompt) that has none: vLLM's completions
//     endpoint would stop at 16 tokens, where the chat request it continues
//     ran to the end of the context. It gets max_model_len less the prompt,
//     what vLLM gives a chat request without a limit.
//   - priority, with PriorityBands (vLLM's --scheduling-policy priority),
//     on a request that has a band: the band's offset plus the client's own
//     priority (within ±999), in place of the client's "priority" if it
//     sent one, else added last.
var returnTokenIDs = []byte(`"return_token_ids"`)

// prepare returns req as it goes to vLLM: req itself, or a copy with the
// body (and its view) amended.
func (e *Engine) prepare(req *engine.Request) *engine.Request {
	if !req.Kind.Generates() {
		return req
	}
	view := req.View
	if view == nil {
		var err *schemas.Error
		if view, err = schemas.ReadRequestFor(req.Kind, req.Body, req.Model); err != nil {
			return req // the core answers the 400
		}
	}
	var add []byte
	if req.TokenIDs && view.Stream && !bytes.Contains(view.Body, returnTokenIDs) {
		add = append(add, `"return_token_ids":true`...)
	}
	if req.Resume > 0 && req.Kind == schemas.KindCompletion && view.MaxTokens == 0 && !view.Prompt.IsText() {
		if ids := view.Prompt.TokenIDs(); len(ids) == 1 {
			if limit := e.maxModelLen(view.Model); limit > len(ids[0]) {
				if len(add) > 0 {
					add = append(add, ',')
				}
				add = append(add, `"max_tokens":`...)
				add = strconv.AppendInt(add, int64(limit-len(ids[0])), 10)
			}
		}
	}
	var prio []byte
	if e.cfg.PriorityBands && req.Band.Valid() {
		p := bandPriority[req.Band] + min(max(view.Priority, -999), 999)
		prio = strconv.AppendInt(nil, int64(p), 10)
	}
	if len(add) == 0 && prio == nil {
		return req
	}
	body := view.Body
	if len(add) > 0 {
		body = insertMembers(body, add)
	}
	if prio != nil {
		if b, ok := replaceMember(body, "priority", prio); ok {
			body = b
		} else {
			body = appendMember(body, append([]byte(`"priority":`), prio...))
		}
	}
	v := *view // its raw parts alias the old body, which stays as it is
	v.Body = body
	out := *req
	out.Body, out.View = body, &v
	return &out
}

// bandPriority is each band's offset of vLLM's priority: lower runs first.
var bandPriority = [schemas.NumBands]int{schemas.BandCritical: -1000, schemas.BandInteractive: 0, schemas.BandBatch: 1000}

// replaceMember is the object body with the value of its top-level member
// key replaced by value, in a new slice; ok is false when it has no such
// member.
func replaceMember(body []byte, key string, value []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"`+key+`"`)) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		afterKey := dec.InputOffset()
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		if k, _ := t.(string); k == key {
			end := int(dec.InputOffset())
			start := end - len(raw)
			if start < int(afterKey) {
				return nil, false
			}
			out := make([]byte, 0, len(body)-len(raw)+len(value))
			out = append(out, body[:start]...)
			out = append(out, value...)
			return append(out, body[end:]...), true
		}
	}
	return nil, false
}

// appendMember is the object body with member (`"k":v`) added last, in a
// new slice.
func appendMember(body, member []byte) []byte {
	i := bytes.LastIndexByte(body, '}') // ReadRequest checked it is an object
	head := bytes.TrimRight(body[:i], " \t\r\n")
	out := make([]byte, 0, len(body)+len(member)+1)
	out = append(out, head...)
	if head[len(head)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, member...)
	return append(out, body[i:]...)
}

// insertMembers is the object body with members (`"k":v,...`) inserted
// first, in a new slice.
func insertMembers(body, members []byte) []byte {
	i := bytes.IndexByte(body, '{') // ReadRequest checked it is an object
	out := make([]byte, 0, len(body)+len(members)+1)
	out = append(out, body[:i+1]...)
	out = append(out, members...)
	if rest := bytes.TrimSpace(body[i+1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[i+1:]...)
}

// maxModelLen is the context length of model, or of the one base model
// vLLM serves when model is an adapter; 0: unknown.
func (e *Engine) maxModelLen(model string) int {
	lens := e.core.MaxModelLens()
	if n, ok := lens[model]; ok {
		return n
	}
	if len(lens) == 1 {
		for _, n := range lens {
			return n
		}
	}
	return 0
}
