package vllm

import (
	"bytes"
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
	if len(add) == 0 {
		return req
	}
	body := insertMembers(view.Body, add)
	v := *view // its raw parts alias the old body, which stays as it is
	v.Body = body
	out := *req
	out.Body, out.View = body, &v
	return &out
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
