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
	// What a drop saves: the bytes of the dropped items' messages alone
	// (not the instructions and tools each body has again).
	bare := &CreateRequest{}
	// As a JSON array, k messages carry k-1 commas and two brackets; in
	// the conversation's array they carry k commas: one byte less.
	size := func(items []Item) int { m, _ := json.Marshal(chatMessages(bare, items)); return len(m) - 1 }
	t := newTrimmer(items)
	for range maxRecounts + 1 {
		// The estimate falls by the bytes dropped so far, summed before
		// they are turned into tokens: a fraction lost at each of
		// thousands of small drops adds up.
		start, gone := n, 0
		for n+reserve > limit {
			dropped := t.dropTurn()
			if dropped == nil {
				return nil, refuse(n)
			}
			gone += size(dropped)
			n = start - int(perByte*float64(gone))
		}
		items = t.kept()
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

// trimmer drops a conversation's oldest items, each drop costing only
// what it drops (a conversation of thousands of items is trimmed in linear
// time): items stay where they are, marked gone.
type trimmer struct {
	items []Item
	gone  []bool
	next  int              // no droppable item that is not gone lies before it
	left  int              // droppable items not gone
	outs  map[string][]int // a function call's id: the indices of its outputs
}

func newTrimmer(items []Item) *trimmer {
	t := &trimmer{items: items, gone: make([]bool, len(items)), outs: map[string][]int{}}
	for i, it := range items {
		if droppable(it) {
			t.left++
		}
		if it.Type == "function_call_output" && it.CallID != "" {
			t.outs[it.CallID] = append(t.outs[it.CallID], i)
		}
	}
	return t
}

// oldest is the index of the oldest item that may go, -1 when none.
func (t *trimmer) oldest() int {
	for t.next < len(t.items) && (t.gone[t.next] || !droppable(t.items[t.next])) {
		t.next++
	}
	if t.next == len(t.items) {
		return -1
	}
	return t.next
}

// dropTurn removes the oldest turn: the oldest item that may go, and
// those after it up to the next user message (chat templates that want
// user and assistant turns to alternate refuse a conversation that starts
// with an assistant's); dropped is nil when nothing may go.
func (t *trimmer) dropTurn() (dropped []Item) {
	dropped = t.dropOldest()
	for dropped != nil {
		i := t.oldest()
		if i < 0 || t.items[i].Type == "message" && t.items[i].Role == "user" {
			break
		}
		d := t.dropOldest()
		if d == nil {
			break
		}
		dropped = append(dropped, d...)
	}
	return dropped
}

// droppable: an item truncation may drop (not a system or developer
// message).
func droppable(it Item) bool {
	return it.Type != "message" || it.Role != "system" && it.Role != "developer"
}

// dropOldest removes the oldest item that may go (not a system or
// developer message), with the outputs of a function call it removes (a
// tool message without its call is refused by chat templates); dropped is
// nil when that would leave no item that may go (no turn).
func (t *trimmer) dropOldest() (dropped []Item) {
	first := t.oldest()
	if first < 0 {
		return nil
	}
	goes := []int{first}
	if it := t.items[first]; it.Type == "function_call" && it.CallID != "" {
		for _, j := range t.outs[it.CallID] {
			if !t.gone[j] && j != first {
				goes = append(goes, j)
			}
		}
	}
	if t.left-len(goes) <= 0 { // every one of them is droppable
		return nil
	}
	slices.Sort(goes)
	for _, j := range goes {
		t.gone[j] = true
		dropped = append(dropped, t.items[j])
	}
	t.left -= len(goes)
	return dropped
}

// kept is the items not dropped, in order.
func (t *trimmer) kept() []Item {
	out := make([]Item, 0, len(t.items))
	for i, it := range t.items {
		if !t.gone[i] {
			out = append(out, it)
		}
	}
	return out
}
