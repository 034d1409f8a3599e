package responses

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// Gen turns one chat stream into a response and its events, in OpenAI's
// order: response.created, response.in_progress, then an output item per
// thing the engine streams, each as it streams it:
//
//   - reasoning (the chat deltas' reasoning_content, vLLM's): a reasoning
//     item, output_item.added, content_part.added (reasoning_text),
//     reasoning_text.delta..., reasoning_text.done, content_part.done,
//     output_item.done;
//   - text: a message, output_item.added, content_part.added (output_text),
//     output_text.delta... (with the tokens' logprobs when the engine sends
//     them), output_text.done, content_part.done, output_item.done;
//   - each tool call (by its chat index): a function_call,
//     output_item.added, function_call_arguments.delta per piece of the
//     arguments as the engine sends it, function_call_arguments.done,
//     output_item.done.
//
// An item is done when another kind begins (reasoning, text, calls) or at
// the end; parallel calls stay open together until then. Last comes
// response.completed, .incomplete or .failed. Each event gets the next
// sequence_number.
//
// A Gen's state is what its events say: Replay rebuilds it from events
// already stored, so that a background response taken over by another
// runner continues with the next sequence number and the text so far.
type Gen struct {
	Resp *Response
	emit func(*Event) error // marshals ev before it returns: ev is reused

	seq    int
	base   int // deltas sent before this chat request (a continuation's)
	tokens int // deltas sent: text, reasoning and arguments (about a token each)
	// reasoning: the reasoning deltas among them (vLLM reports no
	// reasoning_tokens in its usage: they are counted here)
	reasoningN int
	rs         *textItem         // the open reasoning item
	msg        *textItem         // the open message
	calls      []*callItem       // open function calls, in output order
	byIdx      map[int]*callItem // open calls of this chat request, by tool call index
	finish     string
	usage      chatUsage
	ended      bool
}

// textItem is an open message or reasoning item.
type textItem struct {
	idx      int
	id       string
	text     strings.Builder
	logprobs []tokenLogprob // a message's, when the engine sends them
}

// callItem is an open function call.
type callItem struct {
	idx  int
	item Item            // Arguments set when the call closes
	args strings.Builder // the arguments as the deltas come
}

// NewGen starts the events of resp; emit is called with each event.
func NewGen(resp *Response, emit func(*Event) error) *Gen {
	return &Gen{Resp: resp, emit: emit, byIdx: map[int]*callItem{}}
}

// Seq is the sequence number the next event gets.
func (g *Gen) Seq() int { return g.seq }

// Ended reports whether a terminal event was sent (or replayed).
func (g *Gen) Ended() bool { return g.ended }

func ptr[T any](v T) *T { return &v }

func (g *Gen) send(ev Event) error {
	ev.SequenceNumber = g.seq
	if err := g.emit(&ev); err != nil {
		return err
	}
	g.Replay(&ev)
	return nil
}

// Replay applies an event (sent by this Gen or read back from the store).
func (g *Gen) Replay(ev *Event) {
	g.seq = ev.SequenceNumber + 1
	switch ev.Type {
	case "response.output_item.added":
		if ev.Item == nil || ev.OutputIndex == nil {
			return
		}
		idx := *ev.OutputIndex
		for len(g.Resp.Output) <= idx {
			g.Resp.Output = append(g.Resp.Output, Item{})
		}
		g.Resp.Output[idx] = *ev.Item
		switch ev.Item.Type {
		case "message":
			g.msg = &textItem{idx: idx, id: ev.Item.ID}
		case "reasoning":
			g.rs = &textItem{idx: idx, id: ev.Item.ID}
		case "function_call":
			g.calls = append(g.calls, &callItem{idx: idx, item: *ev.Item})
		}
	case "response.output_item.done":
		if ev.Item == nil || ev.OutputIndex == nil || *ev.OutputIndex >= len(g.Resp.Output) {
			return
		}
		g.Resp.Output[*ev.OutputIndex] = *ev.Item
		switch {
		case g.msg != nil && g.msg.id == ev.Item.ID:
			g.msg = nil
		case g.rs != nil && g.rs.id == ev.Item.ID:
			g.rs = nil
		default:
			g.calls = slices.DeleteFunc(g.calls, func(c *callItem) bool { return c.item.ID == ev.Item.ID })
			for i, c := range g.byIdx {
				if c.item.ID == ev.Item.ID {
					delete(g.byIdx, i)
				}
			}
		}
	case "response.output_text.delta":
		if ev.Delta != nil && g.msg != nil {
			g.msg.text.WriteString(*ev.Delta)
			switch {
			case ev.lps != nil: // live: the engine's own, bytes and all
				g.msg.logprobs = append(g.msg.logprobs, ev.lps...)
			case len(ev.Logprobs) > len("[]"): // read back from the store
				g.msg.logprobs = append(g.msg.logprobs, readLogprobs(ev.Logprobs)...)
			}
			g.tokens++
		}
	case "response.reasoning_text.delta":
		if ev.Delta != nil && g.rs != nil {
			g.rs.text.WriteString(*ev.Delta)
			g.tokens++
			g.reasoningN++
		}
	case "response.function_call_arguments.delta":
		if ev.Delta != nil {
			for _, c := range g.calls {
				if c.item.ID == ev.ItemID {
					c.args.WriteString(*ev.Delta)
					g.tokens++
				}
			}
		}
	case "response.in_progress":
		g.Resp.Status = StatusInProgress
	default:
		if ev.Terminal() && ev.Response != nil {
			*g.Resp = *ev.Response
			g.ended = true
		} else if ev.Terminal() {
			g.ended = true
		}
	}
}

// Begin sends response.created and response.in_progress (created in
// status queued for a background response).
func (g *Gen) Begin() error {
	r := *g.Resp
	r.Status = StatusInProgress
	if r.Background {
		r.Status = StatusQueued
	}
	if err := g.send(Event{Type: "response.created", Response: &r}); err != nil {
		return err
	}
	r.Status = StatusInProgress
	return g.send(Event{Type: "response.in_progress", Response: &r})
}

// reasoning sends a piece of reasoning text: the reasoning item first if
// none is open (the message and calls before it are done).
func (g *Gen) reasoning(s string) error {
	if g.rs == nil {
		if err := g.closeText(&g.msg, StatusCompleted); err != nil {
			return err
		}
		if err := g.closeCalls(StatusCompleted); err != nil {
			return err
		}
		idx := len(g.Resp.Output)
		it := Item{Type: "reasoning", ID: outputItemID("rs", g.Resp.ID), Status: StatusInProgress}
		if err := g.send(Event{Type: "response.output_item.added", OutputIndex: ptr(idx), Item: &it}); err != nil {
			return err
		}
		if err := g.send(Event{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: ptr(idx), ContentIndex: ptr(0),
			Part: &Content{Type: "reasoning_text"}}); err != nil {
			return err
		}
	}
	return g.send(Event{Type: "response.reasoning_text.delta", ItemID: g.rs.id, OutputIndex: ptr(g.rs.idx), ContentIndex: ptr(0), Delta: &s})
}

// text sends a piece of the answer's text: the message first if none is
// open (the reasoning and calls before it are done).
func (g *Gen) text(s string, lps []tokenLogprob) error {
	if g.msg == nil {
		if err := g.closeText(&g.rs, StatusCompleted); err != nil {
			return err
		}
		if err := g.closeCalls(StatusCompleted); err != nil {
			return err
		}
		idx := len(g.Resp.Output)
		it := Item{Type: "message", ID: outputItemID("msg", g.Resp.ID), Status: StatusInProgress, Role: "assistant", Content: []Content{}}
		if err := g.send(Event{Type: "response.output_item.added", OutputIndex: ptr(idx), Item: &it}); err != nil {
			return err
		}
		if err := g.send(Event{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: ptr(idx), ContentIndex: ptr(0),
			Part: ptr(textPart("output_text", ""))}); err != nil {
			return err
		}
	}
	return g.send(Event{Type: "response.output_text.delta", ItemID: g.msg.id, OutputIndex: ptr(g.msg.idx),
		ContentIndex: ptr(0), Delta: &s, Logprobs: deltaLogprobs(lps), lps: lps})
}

// toolCall sends a tool call delta: the function_call item first when its
// index is new (the reasoning and message before it are done), then the
// piece of arguments it carries, as it came.
func (g *Gen) toolCall(tc chatToolCall) error {
	if tc.Index < 0 || tc.Index > 127 {
		return nil // no engine sends that many calls: not a list to grow
	}
	c := g.byIdx[tc.Index]
	if c == nil {
		if err := g.closeText(&g.rs, StatusCompleted); err != nil {
			return err
		}
		if err := g.closeText(&g.msg, StatusCompleted); err != nil {
			return err
		}
		callID := tc.ID
		if callID == "" {
			callID = "call_" + nuid.Next()
		}
		idx := len(g.Resp.Output)
		it := Item{Type: "function_call", ID: outputItemID("fc", g.Resp.ID), Status: StatusInProgress, CallID: callID, Name: tc.Function.Name}
		if err := g.send(Event{Type: "response.output_item.added", OutputIndex: ptr(idx), Item: &it}); err != nil {
			return err
		}
		c = g.calls[len(g.calls)-1]
		g.byIdx[tc.Index] = c
	} else if tc.Function.Name != "" && tc.Function.Name != c.item.Name && c.args.Len() == 0 {
		// A name in pieces, before its arguments (OpenAI sends it whole,
		// once; a piece that repeats the whole name is no piece).
		c.item.Name += tc.Function.Name
	}
	if tc.Function.Arguments == "" {
		return nil
	}
	args := tc.Function.Arguments
	return g.send(Event{Type: "response.function_call_arguments.delta", ItemID: c.item.ID, OutputIndex: ptr(c.idx), Delta: &args})
}

// closeText ends the open message or reasoning item *t, if any, with
// status.
func (g *Gen) closeText(t **textItem, status string) error {
	ti := *t
	if ti == nil {
		return nil
	}
	txt := ti.text.String()
	if ti == g.rs {
		if err := g.send(Event{Type: "response.reasoning_text.done", ItemID: ti.id, OutputIndex: ptr(ti.idx), ContentIndex: ptr(0), Text: &txt}); err != nil {
			return err
		}
		part := Content{Type: "reasoning_text", Text: txt}
		if err := g.send(Event{Type: "response.content_part.done", ItemID: ti.id, OutputIndex: ptr(ti.idx), ContentIndex: ptr(0), Part: &part}); err != nil {
			return err
		}
		it := Item{Type: "reasoning", ID: ti.id, Status: status, Content: []Content{part}}
		return g.send(Event{Type: "response.output_item.done", OutputIndex: ptr(ti.idx), Item: &it})
	}
	if err := g.send(Event{Type: "response.output_text.done", ItemID: ti.id, OutputIndex: ptr(ti.idx), ContentIndex: ptr(0),
		Text: &txt, Logprobs: deltaLogprobs(ti.logprobs)}); err != nil {
		return err
	}
	part := textPart("output_text", txt)
	if len(ti.logprobs) > 0 {
		part.Logprobs, _ = json.Marshal(ti.logprobs)
	}
	if err := g.send(Event{Type: "response.content_part.done", ItemID: ti.id, OutputIndex: ptr(ti.idx), ContentIndex: ptr(0), Part: &part}); err != nil {
		return err
	}
	it := Item{Type: "message", ID: ti.id, Status: status, Role: "assistant", Content: []Content{part}}
	return g.send(Event{Type: "response.output_item.done", OutputIndex: ptr(ti.idx), Item: &it})
}

// closeCalls ends every open function call, in output order.
func (g *Gen) closeCalls(status string) error {
	for len(g.calls) > 0 {
		c := g.calls[0]
		c.item.Arguments = c.args.String()
		args := c.item.Arguments
		if err := g.send(Event{Type: "response.function_call_arguments.done", ItemID: c.item.ID, OutputIndex: ptr(c.idx),
			Name: c.item.Name, Arguments: &args}); err != nil {
			return err
		}
		it := c.item
		it.Status = status
		if err := g.send(Event{Type: "response.output_item.done", OutputIndex: ptr(c.idx), Item: &it}); err != nil {
			return err
		}
	}
	return nil
}

// chatChunk is what Gen reads of a chat stream chunk.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content *string `json:"content"`
			// vLLM's reasoning parsers: reasoning_content, renamed
			// reasoning in later releases.
			ReasoningContent *string        `json:"reasoning_content"`
			Reasoning        *string        `json:"reasoning"`
			ToolCalls        []chatToolCall `json:"tool_calls"`
		} `json:"delta"`
		Logprobs *struct {
			Content []tokenLogprob `json:"content"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

type chatToolCall struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// chatUsage is a chat usage object with the details Responses reports.
type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// reasoningText is a delta's reasoning, under either of vLLM's names.
func reasoningText(content, renamed *string) string {
	if content != nil {
		return *content
	}
	if renamed != nil {
		return *renamed
	}
	return ""
}

// Run sends r and turns its stream into events until the response ends;
// Begin must have been called (or replayed). An error before the first
// frame is returned as is and nothing is sent (the caller may still
// answer with an HTTP error); a later one ends the response failed, in
// band. An emit error (a client gone, a store that refused) is returned.
func (g *Gen) Run(ctx context.Context, cl *client.Client, r *client.Request) error {
	st, err := cl.Start(r)
	if err != nil {
		return err
	}
	defer st.Close()
	first, err := st.Next(ctx)
	if err != nil {
		return err
	}
	return g.Consume(ctx, st, first)
}

// stopped is what a line callback returns to stop ForEachLine on an emit
// error, which it carries.
type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }

// Consume is Run after the first frame f, which the caller read.
func (g *Gen) Consume(ctx context.Context, st *client.Stream, f schemas.Frame) error {
	g.base = g.tokens // a continuation's usage counts from here
	for {
		if done, err := g.Feed(f); done || err != nil {
			return err
		}
		var err error
		if f, err = st.Next(ctx); err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return g.End(schemas.AsError(err))
		}
	}
}

// Feed turns one frame of the chat stream into events; done after the
// done frame (the response ended). For a caller that reads the frames
// itself (the gateway's stream writer); Consume is the loop.
func (g *Gen) Feed(f schemas.Frame) (done bool, err error) {
	switch f.Type {
	case schemas.FrameChunk:
		err := schemas.ForEachLine(f.Payload, func(line []byte) error {
			var ch chatChunk
			if json.Unmarshal(line, &ch) != nil {
				return nil // not a chunk tokenbus knows: skipped
			}
			if ch.Usage != nil {
				g.usage = *ch.Usage
				g.usage.CompletionTokens += g.base
			}
			for _, c := range ch.Choices {
				if c.FinishReason != nil && *c.FinishReason != "" {
					g.finish = *c.FinishReason
				}
				if r := reasoningText(c.Delta.ReasoningContent, c.Delta.Reasoning); r != "" {
					if err := g.reasoning(r); err != nil {
						return stopped{err}
					}
				}
				if c.Delta.Content != nil && *c.Delta.Content != "" {
					var lps []tokenLogprob
					if c.Logprobs != nil {
						lps = fillLogprobs(c.Logprobs.Content)
					}
					if err := g.text(*c.Delta.Content, lps); err != nil {
						return stopped{err}
					}
				}
				for _, tc := range c.Delta.ToolCalls {
					if err := g.toolCall(tc); err != nil {
						return stopped{err}
					}
				}
			}
			return nil
		})
		if s, ok := err.(stopped); ok {
			return true, s.err
		}
	case schemas.FrameDone:
		if u := schemas.UsageOf(f.Payload); u != nil && g.usage.CompletionTokens == 0 {
			g.usage = chatUsage{PromptTokens: u.PromptTokens, CompletionTokens: g.base + u.CompletionTokens}
			if u.PromptTokensDetails != nil {
				g.usage.PromptTokensDetails = &struct {
					CachedTokens int `json:"cached_tokens"`
				}{u.PromptTokensDetails.CachedTokens}
			}
		}
		return true, g.End(nil)
	}
	return false, nil
}

// End closes the open items and sends the terminal event:
// response.failed when e is not nil, .incomplete when the engine stopped
// at the length limit (the items still open then are incomplete), else
// .completed.
func (g *Gen) End(e *schemas.Error) error {
	status := StatusCompleted
	if e != nil || g.finish == "length" {
		status = StatusIncomplete
	}
	if err := g.closeText(&g.rs, status); err != nil {
		return err
	}
	if err := g.closeText(&g.msg, status); err != nil {
		return err
	}
	if err := g.closeCalls(status); err != nil {
		return err
	}
	r := *g.Resp
	u := g.usage
	cached, reasoning := 0, 0
	if u.PromptTokensDetails != nil {
		cached = u.PromptTokensDetails.CachedTokens
	}
	if u.CompletionTokensDetails != nil {
		reasoning = u.CompletionTokensDetails.ReasoningTokens
	}
	r.Usage = newUsage(u.PromptTokens, max(u.CompletionTokens, g.tokens), cached, max(reasoning, g.reasoningN))
	typ := "response.completed"
	switch {
	case e != nil:
		typ, r.Status = "response.failed", StatusFailed
		code := "server_error"
		if e.Body.Code != nil && *e.Body.Code != "" {
			code = *e.Body.Code
		}
		r.Error = &Error{Code: code, Message: e.Body.Message}
	case g.finish == "length":
		typ, r.Status = "response.incomplete", StatusIncomplete
		r.IncompleteDetails = &Incomplete{Reason: "max_output_tokens"}
	default:
		r.Status = StatusCompleted
	}
	return g.send(Event{Type: typ, Response: &r})
}

// Resume is the request that continues a replayed response on another
// runner: nil when what was sent had reached max_output_tokens. The
// reasoning or calls the dead runner left open are ended incomplete (a
// new run cannot go on with them: it reasons and calls again, in new
// items); an open message's text is continued as a final assistant
// message (continue_final_message). max_tokens is reduced by every delta
// sent.
func (g *Gen) Resume(body []byte) ([]byte, error) {
	if err := g.closeText(&g.rs, StatusIncomplete); err != nil {
		return nil, err
	}
	if err := g.closeCalls(StatusIncomplete); err != nil {
		return nil, err
	}
	if g.tokens == 0 {
		return body, nil
	}
	text := ""
	if g.msg != nil {
		text = g.msg.text.String()
	}
	out, done, err := continued(body, text, g.tokens)
	if done {
		g.finish = "length"
		return nil, err
	}
	return out, err
}
