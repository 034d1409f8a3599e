package responses

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

func chunk(s string) schemas.Frame {
	return schemas.Frame{Type: schemas.FrameChunk, Payload: []byte(s)}
}

var doneFrame = schemas.Frame{Type: schemas.FrameDone, Payload: []byte(`{}`)}

// collect runs frames through a Gen and returns its events as sent.
func collect(t *testing.T, g *Gen, evs *[]Event, frames ...schemas.Frame) {
	t.Helper()
	for _, f := range frames {
		done, err := g.Feed(f)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
	}
}

func newTestGen(evs *[]Event) *Gen {
	resp := New("resp_test", &CreateRequest{Model: "m"}, time.Unix(0, 0))
	return NewGen(resp, func(ev *Event) error {
		// A copy through JSON, as a store or a client sees it.
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		var c Event
		if err := json.Unmarshal(b, &c); err != nil {
			return err
		}
		*evs = append(*evs, c)
		return nil
	})
}

// brief is an event in a line: its type without "response.", its output
// index and what it carries.
func brief(e Event) string {
	typ := strings.TrimPrefix(e.Type, "response.")
	idx := ""
	if e.OutputIndex != nil {
		idx = fmt.Sprintf("[%d]", *e.OutputIndex)
	}
	switch {
	case e.Item != nil:
		return fmt.Sprintf("%s%s %s %s", typ, idx, e.Item.Type, e.Item.Status)
	case e.Part != nil:
		return fmt.Sprintf("%s%s %s %q", typ, idx, e.Part.Type, e.Part.Text)
	case e.Delta != nil:
		return fmt.Sprintf("%s%s %q", typ, idx, *e.Delta)
	case e.Arguments != nil:
		return fmt.Sprintf("%s%s %s %q", typ, idx, e.Name, *e.Arguments)
	case e.Text != nil:
		return fmt.Sprintf("%s%s %q", typ, idx, *e.Text)
	}
	return typ + idx
}

func briefs(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = brief(e)
	}
	return out
}

const (
	roleChunk = `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`
	usage5_2  = `{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`
)

func TestGenEvents(t *testing.T) {
	tests := []struct {
		name   string
		frames []schemas.Frame
		want   []string
		status string
		output string // the final output items, as JSON (ids left out)
	}{
		{"text", []schemas.Frame{
			chunk(roleChunk),
			chunk(`{"choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n" + `{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`),
			chunk(usage5_2), doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] message in_progress", `content_part.added[0] output_text ""`,
				`output_text.delta[0] "Hel"`, `output_text.delta[0] "lo"`, `output_text.done[0] "Hello"`,
				`content_part.done[0] output_text "Hello"`, "output_item.done[0] message completed", "completed"},
			StatusCompleted,
			`[{"type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[],"logprobs":[]}]}]`},
		{"length", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"length"}]}`),
			{Type: schemas.FrameDone, Payload: []byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)}},
			[]string{"created", "in_progress", "output_item.added[0] message in_progress", `content_part.added[0] output_text ""`,
				`output_text.delta[0] "a"`, `output_text.done[0] "a"`, `content_part.done[0] output_text "a"`,
				"output_item.done[0] message incomplete", "incomplete"},
			StatusIncomplete, ""},
		{"tool call in pieces", []schemas.Frame{
			chunk(roleChunk),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":""}}]}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}`),
			chunk(usage5_2), doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] function_call in_progress",
				`function_call_arguments.delta[0] "{\"a\""`, `function_call_arguments.delta[0] ":1}"`,
				`function_call_arguments.done[0] get "{\"a\":1}"`, "output_item.done[0] function_call completed", "completed"},
			StatusCompleted,
			`[{"type":"function_call","status":"completed","call_id":"call_1","name":"get","arguments":"{\"a\":1}"}]`},
		{"parallel calls, interleaved", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"f","arguments":"{\"x\":"}}]}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"g","arguments":"{"}}]}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}},{"index":1,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`),
			doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] function_call in_progress", `function_call_arguments.delta[0] "{\"x\":"`,
				"output_item.added[1] function_call in_progress", `function_call_arguments.delta[1] "{"`,
				`function_call_arguments.delta[0] "1}"`, `function_call_arguments.delta[1] "}"`,
				`function_call_arguments.done[0] f "{\"x\":1}"`, "output_item.done[0] function_call completed",
				`function_call_arguments.done[1] g "{}"`, "output_item.done[1] function_call completed", "completed"},
			StatusCompleted,
			`[{"type":"function_call","status":"completed","call_id":"call_a","name":"f","arguments":"{\"x\":1}"},` +
				`{"type":"function_call","status":"completed","call_id":"call_b","name":"g","arguments":"{}"}]`},
		{"text then a call", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"content":"Let me look."}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"get","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`),
			doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] message in_progress", `content_part.added[0] output_text ""`,
				`output_text.delta[0] "Let me look."`, `output_text.done[0] "Let me look."`, `content_part.done[0] output_text "Let me look."`,
				"output_item.done[0] message completed", "output_item.added[1] function_call in_progress",
				`function_call_arguments.delta[1] "{}"`, `function_call_arguments.done[1] get "{}"`,
				"output_item.done[1] function_call completed", "completed"},
			StatusCompleted, ""},
		{"reasoning then text", []schemas.Frame{
			chunk(roleChunk),
			chunk(`{"choices":[{"index":0,"delta":{"reasoning_content":"Think"}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"reasoning_content":"ing."}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"content":"4"},"finish_reason":"stop"}]}`),
			chunk(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`),
			doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] reasoning in_progress", `content_part.added[0] reasoning_text ""`,
				`reasoning_text.delta[0] "Think"`, `reasoning_text.delta[0] "ing."`, `reasoning_text.done[0] "Thinking."`,
				`content_part.done[0] reasoning_text "Thinking."`, "output_item.done[0] reasoning completed",
				"output_item.added[1] message in_progress", `content_part.added[1] output_text ""`, `output_text.delta[1] "4"`,
				`output_text.done[1] "4"`, `content_part.done[1] output_text "4"`, "output_item.done[1] message completed", "completed"},
			StatusCompleted,
			`[{"type":"reasoning","status":"completed","summary":[],"content":[{"type":"reasoning_text","text":"Thinking."}]},` +
				`{"type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"4","annotations":[],"logprobs":[]}]}]`},
		{"reasoning under vLLM's newer name, then a call", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"reasoning":"Use f."}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`),
			doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] reasoning in_progress", `content_part.added[0] reasoning_text ""`,
				`reasoning_text.delta[0] "Use f."`, `reasoning_text.done[0] "Use f."`, `content_part.done[0] reasoning_text "Use f."`,
				"output_item.done[0] reasoning completed", "output_item.added[1] function_call in_progress",
				`function_call_arguments.delta[1] "{}"`, `function_call_arguments.done[1] f "{}"`,
				"output_item.done[1] function_call completed", "completed"},
			StatusCompleted, ""},
		{"logprobs", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.5,"bytes":[72,105]},{"token":"Ho","logprob":-1.5}]}]}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[{"token":"!","logprob":-0.1}]},"finish_reason":"stop"}]}`),
			doneFrame},
			[]string{"created", "in_progress", "output_item.added[0] message in_progress", `content_part.added[0] output_text ""`,
				`output_text.delta[0] "Hi"`, `output_text.delta[0] "!"`, `output_text.done[0] "Hi!"`,
				`content_part.done[0] output_text "Hi!"`, "output_item.done[0] message completed", "completed"},
			StatusCompleted,
			`[{"type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi!","annotations":[],"logprobs":` +
				`[{"token":"Hi","bytes":[72,105],"logprob":-0.5,"top_logprobs":[{"token":"Hi","bytes":[72,105],"logprob":-0.5},{"token":"Ho","bytes":[72,111],"logprob":-1.5}]},` +
				`{"token":"!","bytes":[33],"logprob":-0.1,"top_logprobs":[]}]}]}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var evs []Event
			g := newTestGen(&evs)
			if err := g.Begin(); err != nil {
				t.Fatal(err)
			}
			collect(t, g, &evs, tt.frames...)
			if got := briefs(evs); !slices.Equal(got, tt.want) {
				t.Fatalf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			for i, e := range evs {
				if e.SequenceNumber != i {
					t.Fatalf("event %d has sequence_number %d", i, e.SequenceNumber)
				}
			}
			last := evs[len(evs)-1].Response
			if last == nil || last.Status != tt.status || last.Usage == nil || last.Usage.TotalTokens != last.Usage.InputTokens+last.Usage.OutputTokens {
				t.Fatalf("final response %+v", last)
			}
			checkItemEvents(t, evs, last)
			if tt.output != "" {
				if got, want := outputJSON(t, last.Output), canonical(t, tt.output); got != want {
					t.Fatalf("output\n%s\nwant\n%s", got, want)
				}
			}
		})
	}
}

// checkItemEvents: every event of an item names its id, and the item
// done is the one in the final output at its index.
func checkItemEvents(t *testing.T, evs []Event, final *Response) {
	t.Helper()
	ids := map[int]string{}
	for _, e := range evs {
		switch {
		case e.Type == "response.output_item.added":
			ids[*e.OutputIndex] = e.Item.ID
		case e.Type == "response.output_item.done":
			if e.Item.ID != ids[*e.OutputIndex] || final.Output[*e.OutputIndex].ID != e.Item.ID {
				t.Fatalf("item done %s at %d: added %s, final %s", e.Item.ID, *e.OutputIndex, ids[*e.OutputIndex], final.Output[*e.OutputIndex].ID)
			}
		case e.ItemID != "":
			if e.ItemID != ids[*e.OutputIndex] {
				t.Fatalf("%s names item %s at %d, which is %s", e.Type, e.ItemID, *e.OutputIndex, ids[*e.OutputIndex])
			}
		}
	}
}

// outputJSON is the output as JSON without the items' ids (made up).
func outputJSON(t *testing.T, out []Item) string {
	t.Helper()
	var items []map[string]any
	b, _ := json.Marshal(out)
	if err := json.Unmarshal(b, &items); err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		id, _ := it["id"].(string)
		if want := map[string]string{"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[it["type"].(string)]; !strings.HasPrefix(id, want) {
			t.Fatalf("item id %q, want prefix %q", id, want)
		}
		delete(it, "id")
	}
	b, _ = json.Marshal(items)
	return string(b)
}

// canonical is JSON with its objects' keys sorted.
func canonical(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestGenUsage: the chat usage's details become the response's.
func TestGenUsage(t *testing.T) {
	var evs []Event
	g := newTestGen(&evs)
	_ = g.Begin()
	collect(t, g, &evs, chunk(`{"choices":[{"index":0,"delta":{"reasoning_content":"r"}}]}`),
		chunk(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`),
		doneFrame)
	u := evs[len(evs)-1].Response.Usage
	b, _ := json.Marshal(u)
	if want := `{"input_tokens":5,"input_tokens_details":{"cached_tokens":4,"cache_write_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":8}`; string(b) != want {
		t.Fatalf("usage %s\nwant %s", b, want)
	}
}

// TestGenLogprobEvents: the delta events carry the token's logprobs in
// the events' form (no bytes), the done event all of them.
func TestGenLogprobEvents(t *testing.T) {
	var evs []Event
	g := newTestGen(&evs)
	_ = g.Begin()
	collect(t, g, &evs, chunk(`{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[{"token":"Ho","logprob":-1.5,"bytes":[72,111]}]}]},"finish_reason":"stop"}]}`),
		doneFrame)
	want := map[string]string{
		"response.output_text.delta": `[{"token":"Hi","logprob":-0.5,"top_logprobs":[{"token":"Ho","logprob":-1.5}]}]`,
		"response.output_text.done":  `[{"token":"Hi","logprob":-0.5,"top_logprobs":[{"token":"Ho","logprob":-1.5}]}]`,
	}
	for _, e := range evs {
		if w, ok := want[e.Type]; ok {
			if string(e.Logprobs) != w {
				t.Fatalf("%s logprobs %s, want %s", e.Type, e.Logprobs, w)
			}
			delete(want, e.Type)
		}
	}
	if len(want) > 0 {
		t.Fatalf("no %v", want)
	}
}

// TestGenFailed: an error mid-stream ends the open items incomplete and
// the response failed.
func TestGenFailed(t *testing.T) {
	var evs []Event
	g := newTestGen(&evs)
	_ = g.Begin()
	collect(t, g, &evs, chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{\"a"}}]}}]}`))
	if err := g.End(schemas.ErrRequestTimeout.New(time.Second)); err != nil {
		t.Fatal(err)
	}
	want := []string{"created", "in_progress", "output_item.added[0] function_call in_progress", `function_call_arguments.delta[0] "{\"a"`,
		`function_call_arguments.done[0] f "{\"a"`, "output_item.done[0] function_call incomplete", "failed"}
	if got := briefs(evs); !slices.Equal(got, want) {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := evs[len(evs)-1].Response; r.Status != StatusFailed || r.Error == nil || r.Error.Code != "timeout" {
		t.Fatalf("final %+v", r)
	}
}

// TestGenReplay: a Gen rebuilt from another's events continues it with
// the next sequence number, the same message and the text so far.
func TestGenReplay(t *testing.T) {
	var first []Event
	g := newTestGen(&first)
	_ = g.Begin()
	collect(t, g, &first, chunk(`{"choices":[{"index":0,"delta":{"content":"ab"}}]}`), chunk(`{"choices":[{"index":0,"delta":{"content":"cd"}}]}`))

	var rest []Event
	h := newTestGen(&rest)
	for i := range first {
		h.Replay(&first[i])
	}
	if h.Seq() != len(first) || h.Ended() {
		t.Fatalf("replayed seq %d ended %v, want %d false", h.Seq(), h.Ended(), len(first))
	}
	body, err := h.Resume([]byte(`{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":10}`))
	if err != nil || !json.Valid(body) {
		t.Fatal(err)
	}
	if len(rest) != 0 {
		t.Fatalf("resuming a message sent %v", briefs(rest))
	}
	collect(t, h, &rest, chunk(`{"choices":[{"index":0,"delta":{"content":"ef"},"finish_reason":"stop"}]}`), doneFrame)
	if rest[0].SequenceNumber != len(first) || rest[0].Type != "response.output_text.delta" {
		t.Fatalf("first event after replay %+v", rest[0])
	}
	end := rest[len(rest)-1].Response
	if end.Output[0].Content[0].Text != "abcdef" || end.Output[0].ID != first[2].Item.ID || end.Usage.OutputTokens != 3 {
		t.Fatalf("after replay: %+v", end.Output)
	}
}

// TestGenResumeOpenItems: reasoning and calls a dead runner left open are
// ended incomplete when another resumes; the budget counts their deltas.
func TestGenResumeOpenItems(t *testing.T) {
	var first []Event
	g := newTestGen(&first)
	_ = g.Begin()
	collect(t, g, &first, chunk(`{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`),
		chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{\"a"}}]}}]}`))

	var rest []Event
	h := newTestGen(&rest)
	for i := range first {
		h.Replay(&first[i])
	}
	body, err := h.Resume([]byte(`{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":10}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`function_call_arguments.done[1] f "{\"a"`, "output_item.done[1] function_call incomplete"}
	if got := briefs(rest); !slices.Equal(got, want) {
		t.Fatalf("resume sent\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || string(m["max_tokens"]) != "8" || m["continue_final_message"] != nil {
		t.Fatalf("continuation %s", body)
	}
}

// The output_text part keeps the engine's bytes of each token: a
// byte-fallback token's ("bytes:\xe6" in vLLM's text) are not its text's.
func TestGenLogprobBytes(t *testing.T) {
	var evs []Event
	g := newTestGen(&evs)
	_ = g.Begin()
	collect(t, g, &evs, chunk(`{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"token":"bytes:\\xe6","logprob":-0.5,"bytes":[230],"top_logprobs":[]}]},"finish_reason":"stop"}]}`),
		doneFrame)
	for _, e := range evs {
		if e.Type == "response.content_part.done" {
			if e.Part == nil || !strings.Contains(string(e.Part.Logprobs), `"bytes":[230]`) {
				t.Fatalf("part logprobs %s", e.Part.Logprobs)
			}
			return
		}
	}
	t.Fatal("no content_part.done")
}

// A function name that comes in pieces is joined, also a piece that is the
// end of what came before ("look" then "ok"); one that repeats the whole
// name is no piece.
func TestGenCallNamePieces(t *testing.T) {
	for _, tc := range []struct {
		pieces []string
		want   string
	}{
		{[]string{"look", "ok"}, "lookok"},
		{[]string{"get_", "weather"}, "get_weather"},
		{[]string{"f", "f"}, "f"},
	} {
		var evs []Event
		g := newTestGen(&evs)
		_ = g.Begin()
		var frames []schemas.Frame
		for i, p := range tc.pieces {
			id := ""
			if i == 0 {
				id = `"id":"c",`
			}
			frames = append(frames, chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,`+id+`"function":{"name":"`+p+`"}}]}}]}`))
		}
		frames = append(frames, chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`), doneFrame)
		collect(t, g, &evs, frames...)
		got := ""
		for _, e := range evs {
			if e.Type == "response.function_call_arguments.done" {
				got = e.Name
			}
		}
		if got != tc.want {
			t.Errorf("pieces %q: name %q, want %q", tc.pieces, got, tc.want)
		}
	}
}

// vLLM reports no reasoning_tokens in its usage: the reasoning deltas are
// counted.
func TestGenCountsReasoningTokens(t *testing.T) {
	var evs []Event
	g := newTestGen(&evs)
	_ = g.Begin()
	collect(t, g, &evs, chunk(`{"choices":[{"index":0,"delta":{"reasoning_content":"Two "}}]}`),
		chunk(`{"choices":[{"index":0,"delta":{"reasoning_content":"steps."}}]}`),
		chunk(`{"choices":[{"index":0,"delta":{"content":"Done"},"finish_reason":"stop"}]}`),
		chunk(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`), doneFrame)
	r := evs[len(evs)-1].Response
	if r == nil || r.Usage == nil || r.Usage.OutputTokensDetails.ReasoningTokens != 2 {
		t.Fatalf("final usage %+v", r)
	}
}
