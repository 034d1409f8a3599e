package responses

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// Gen turns one chat stream into a response and its events, in OpenAI's
// order: response.created, response.in_progress, then for the message
// output_item.added, content_part.added, output_text.delta..., and at the
// end output_text.done, content_part.done, output_item.done (then one
// added/done pair per function call), and response.completed, .incomplete
// or .failed. Each event gets the next sequence_number.
//
// A Gen's state is what its events say: Replay rebuilds it from events
// already stored, so that a background response taken over by another
// runner continues with the next sequence number and the text so far.
type Gen struct {
	Resp *Response
	emit func(*Event) error // marshals ev before it returns: ev is reused

	seq      int
	msgIdx   int // output index of the message item, -1 before it
	text     strings.Builder
	tokens   int // text deltas so far (one per chunk with text)
	prompt   int // prompt tokens of the first run (0 when not known)
	calls    []Item
	finish   string
	usageIn  int
	usageOut int
	ended    bool
}

// NewGen starts the events of resp; emit is called with each event.
func NewGen(resp *Response, emit func(*Event) error) *Gen {
	return &Gen{Resp: resp, emit: emit, msgIdx: -1}
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
		if ev.Item != nil && ev.Item.Type == "message" && ev.OutputIndex != nil {
			g.msgIdx = *ev.OutputIndex
			it := *ev.Item
			for len(g.Resp.Output) <= g.msgIdx {
				g.Resp.Output = append(g.Resp.Output, Item{})
			}
			g.Resp.Output[g.msgIdx] = it
		}
	case "response.output_text.delta":
		if ev.Delta != nil {
			g.text.WriteString(*ev.Delta)
			g.tokens++
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

func (g *Gen) delta(s string) error {
	if g.msgIdx < 0 {
		idx := len(g.Resp.Output)
		it := Item{Type: "message", ID: "msg_" + nuid.Next(), Status: StatusInProgress, Role: "assistant", Content: []Content{}}
		if err := g.send(Event{Type: "response.output_item.added", OutputIndex: ptr(idx), Item: &it}); err != nil {
			return err
		}
		if err := g.send(Event{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: ptr(idx), ContentIndex: ptr(0),
			Part: ptr(textPart("output_text", ""))}); err != nil {
			return err
		}
	}
	return g.send(Event{Type: "response.output_text.delta", ItemID: g.Resp.Output[g.msgIdx].ID, OutputIndex: ptr(g.msgIdx),
		ContentIndex: ptr(0), Delta: &s, Logprobs: json.RawMessage("[]")})
}

// chatChunk is what Gen reads of a chat stream chunk.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
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

// errStopped is what a line callback returns to stop ForEachLine on an
// emit error, which is kept in emitErr.
type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }

// Consume is Run after the first frame f, which the caller read.
func (g *Gen) Consume(ctx context.Context, st *client.Stream, f schemas.Frame) error {
	base := g.tokens // a continuation's usage counts from here
	for {
		if done, err := g.frame(f, base); done || err != nil {
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

// frame turns one frame of the chat stream into events; done after the
// done frame (the response ended). base is the tokens sent before this
// chat request (a continuation's).
func (g *Gen) frame(f schemas.Frame, base int) (done bool, err error) {
	switch f.Type {
	case schemas.FrameChunk:
		err := schemas.ForEachLine(f.Payload, func(line []byte) error {
			var ch chatChunk
			if json.Unmarshal(line, &ch) != nil {
				return nil // not a chunk tokenbus knows: skipped
			}
			if ch.Usage != nil {
				g.usageIn, g.usageOut = ch.Usage.PromptTokens, base+ch.Usage.CompletionTokens
			}
			for _, c := range ch.Choices {
				if c.FinishReason != nil && *c.FinishReason != "" {
					g.finish = *c.FinishReason
				}
				for _, tc := range c.Delta.ToolCalls {
					if tc.Index < 0 || tc.Index > 127 {
						continue // no engine sends that many calls: not a list to grow
					}
					for len(g.calls) <= tc.Index {
						g.calls = append(g.calls, Item{Type: "function_call", ID: "fc_" + nuid.Next(), Status: StatusCompleted})
					}
					call := &g.calls[tc.Index]
					if tc.ID != "" {
						call.CallID = tc.ID
					}
					call.Name += tc.Function.Name
					call.Arguments += tc.Function.Arguments
				}
				if c.Delta.Content != nil && *c.Delta.Content != "" {
					if err := g.delta(*c.Delta.Content); err != nil {
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
		if u := schemas.UsageOf(f.Payload); u != nil && g.usageOut == 0 {
			g.usageIn, g.usageOut = u.PromptTokens, base+u.CompletionTokens
		}
		return true, g.End(nil)
	}
	return false, nil
}

// End closes the message and sends the terminal event: response.failed
// when e is not nil, .incomplete when the engine stopped at the length
// limit, else .completed.
func (g *Gen) End(e *schemas.Error) error {
	if g.msgIdx >= 0 {
		idx, id, txt := g.msgIdx, g.Resp.Output[g.msgIdx].ID, g.text.String()
		if err := g.send(Event{Type: "response.output_text.done", ItemID: id, OutputIndex: ptr(idx), ContentIndex: ptr(0),
			Text: &txt, Logprobs: json.RawMessage("[]")}); err != nil {
			return err
		}
		part := textPart("output_text", txt)
		if err := g.send(Event{Type: "response.content_part.done", ItemID: id, OutputIndex: ptr(idx), ContentIndex: ptr(0), Part: &part}); err != nil {
			return err
		}
		it := Item{Type: "message", ID: id, Status: StatusCompleted, Role: "assistant", Content: []Content{part}}
		if e != nil || g.finish == "length" {
			it.Status = StatusIncomplete
		}
		if err := g.send(Event{Type: "response.output_item.done", OutputIndex: ptr(idx), Item: &it}); err != nil {
			return err
		}
		g.Resp.Output[idx] = it
	}
	if e == nil {
		for _, call := range g.calls {
			idx := len(g.Resp.Output)
			added := call
			added.Status, added.Arguments = StatusInProgress, ""
			if err := g.send(Event{Type: "response.output_item.added", OutputIndex: ptr(idx), Item: &added}); err != nil {
				return err
			}
			// The arguments whole, in one delta: the engine's tool-call
			// deltas are not streamed as they come (the SDKs' helpers
			// build arguments from deltas only).
			args := call.Arguments
			if err := g.send(Event{Type: "response.function_call_arguments.delta", ItemID: call.ID, OutputIndex: ptr(idx), Delta: &args}); err != nil {
				return err
			}
			if err := g.send(Event{Type: "response.function_call_arguments.done", ItemID: call.ID, OutputIndex: ptr(idx),
				Name: call.Name, Arguments: &args}); err != nil {
				return err
			}
			if err := g.send(Event{Type: "response.output_item.done", OutputIndex: ptr(idx), Item: &call}); err != nil {
				return err
			}
			g.Resp.Output = append(g.Resp.Output, call)
		}
	}
	r := *g.Resp
	r.Usage = newUsage(g.usageIn, max(g.usageOut, g.tokens))
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
// runner: body continued after the text its events hold; nil when the
// text had already reached max_output_tokens.
func (g *Gen) Resume(body []byte) ([]byte, error) {
	if g.tokens == 0 {
		return body, nil
	}
	out, done, err := continued(body, g.text.String(), g.tokens)
	if done {
		g.finish = "length"
		return nil, err
	}
	return out, err
}
