package responses

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/tokenbus/tokenbus/schemas"
)

// Truncation: a conversation that does not fit the model's context
// (max_model_len, as /v1/models says it) is refused with 400
// context_length_exceeded (truncation "disabled", the default) or has its
// oldest items dropped until it fits ("auto"), instructions and system
// messages kept. "Fits": the prompt's tokens plus max_output_tokens (0
// when not set) are at most max_model_len; vLLM refuses the same sum.
//
// Tokens are estimated as the rest of tokenbus does at admission, 4 bytes
// of the chat request a token (it errs high for prose, low for code and
// CJK); when the estimate comes within half the limit they are counted
// with the engine's own tokenizer (a tokenize request with the messages
// and tools, through Counter). Only an exact count refuses a request: an
// engine without a tokenizer gets the request and answers for itself,
// and "auto" then drops items by the estimate alone.

// BytesPerToken is the estimate of the prompt's tokens: the chat request's
// bytes over it (as registry.PromptBytesPerToken, at admission).
const BytesPerToken = 4

// Counter counts the prompt tokens of a tokenize request body
// ({"model", "messages", "tools", "add_generation_prompt": true}) with the
// engine's tokenizer; an error when it cannot (no tokenizer, no answer).
type Counter func(ctx context.Context, body []byte) (int, error)

// maxRecounts bounds the exact counts one truncation makes after the
// first (each a round trip to a worker).
const maxRecounts = 3

// Fit returns the items of the conversation (history then input) to send
// for req within limit tokens (0: not known, nothing is checked).
func Fit(ctx context.Context, req *CreateRequest, items []Item, limit int, count Counter) ([]Item, error) {
	if limit <= 0 {
		return items, nil
	}
	reserve := 0
	if req.MaxOutputTokens != nil {
		reserve = *req.MaxOutputTokens
	}
	tools, err := chatTools(req.Tools)
	if err != nil {
		return nil, err
	}
	body := func(items []Item) []byte {
		b, _ := json.Marshal(map[string]any{"model": req.Model, "messages": chatMessages(req, items), "tools": tools,
			"add_generation_prompt": true})
		return b
	}
	b := body(items)
	n := len(b) / BytesPerToken
	if n+reserve <= limit/2 {
		return items, nil // far from the limit, whatever the estimate's error
	}
	exact := false
	if c, err := count(ctx, b); err == nil {
		n, exact = c, true
	}
	if n+reserve <= limit {
		return items, nil
	}
	refuse := func(n int) error {
		return schemas.ErrResponseContextLength.New(fmt.Sprintf("%d tokens of input and %d of max_output_tokens; the context window is %d tokens", n, reserve, limit))
	}
	if !req.Truncates() {
		if !exact {
			return items, nil // only an estimate: the engine counts and answers
		}
		return nil, refuse(n)
	}
	perByte := float64(n) / float64(len(b))
	empty := len(body(nil))
	items = slices.Clone(items)
	for range maxRecounts + 1 {
		for n+reserve > limit {
			var dropped []Item
			if items, dropped = dropTurn(items); dropped == nil {
				return nil, refuse(n)
			}
			n -= int(perByte * float64(len(body(dropped))-empty))
		}
		if !exact {
			return items, nil
		}
		b = body(items)
		c, err := count(ctx, b)
		if err != nil {
			return items, nil // the estimate says it fits
		}
		if n = c; n+reserve <= limit {
			return items, nil
		}
		perByte = float64(n) / float64(len(b))
	}
	return nil, refuse(n)
}

// dropTurn removes the oldest turn: the oldest item that may go, and
// those after it up to the next user message (chat templates that want
// user and assistant turns to alternate refuse a conversation that starts
// with an assistant's); dropped is nil when nothing may go.
func dropTurn(items []Item) (kept, dropped []Item) {
	kept, dropped = dropOldest(items)
	for dropped != nil {
		i := slices.IndexFunc(kept, droppable)
		if i < 0 || kept[i].Type == "message" && kept[i].Role == "user" {
			break
		}
		k, d := dropOldest(kept)
		if d == nil {
			break
		}
		kept, dropped = k, append(dropped, d...)
	}
	return kept, dropped
}

// droppable: an item truncation may drop (not a system or developer
// message).
func droppable(it Item) bool {
	return it.Type != "message" || it.Role != "system" && it.Role != "developer"
}

// dropOldest removes the oldest item that may go (not a system or
// developer message), with the outputs of a function call it removes;
// dropped is nil when that would leave no item that may go (no turn).
func dropOldest(items []Item) (kept, dropped []Item) {
	first := slices.IndexFunc(items, droppable)
	if first < 0 {
		return items, nil
	}
	gone := items[first]
	goes := func(i int, it Item) bool {
		// A tool message without its call is refused by chat templates.
		return i == first || gone.Type == "function_call" && gone.CallID != "" && it.Type == "function_call_output" && it.CallID == gone.CallID
	}
	left := false
	for i, it := range items {
		if goes(i, it) {
			dropped = append(dropped, it)
		} else {
			kept = append(kept, it)
			left = left || droppable(it)
		}
	}
	if !left {
		return items, nil
	}
	return kept, dropped
}
