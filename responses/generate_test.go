package responses

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

func chunk(s string) schemas.Frame {
	return schemas.Frame{Type: schemas.FrameChunk, Payload: []byte(s)}
}

// collect runs frames through a Gen and returns its events as sent.
func collect(t *testing.T, g *Gen, evs *[]Event, frames ...schemas.Frame) {
	t.Helper()
	for _, f := range frames {
		done, err := g.frame(f, 0)
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

func types(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

func TestGenEvents(t *testing.T) {
	tests := []struct {
		name   string
		frames []schemas.Frame
		want   []string
		status string
		output string // the message's text
	}{
		{"text", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n" + `{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`),
			chunk(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`),
			{Type: schemas.FrameDone, Payload: []byte(`{}`)}},
			[]string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
				"response.output_item.done", "response.completed"}, StatusCompleted, "Hello"},
		{"length", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"length"}]}`),
			{Type: schemas.FrameDone, Payload: []byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)}},
			[]string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.done", "response.content_part.done",
				"response.output_item.done", "response.incomplete"}, StatusIncomplete, "a"},
		{"tool call", []schemas.Frame{
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"get","arguments":"{\"a\""}}]}}]}`),
			chunk(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}`),
			{Type: schemas.FrameDone, Payload: []byte(`{}`)}},
			[]string{"response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.delta",
				"response.function_call_arguments.done", "response.output_item.done", "response.completed"}, StatusCompleted, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var evs []Event
			g := newTestGen(&evs)
			if err := g.Begin(); err != nil {
				t.Fatal(err)
			}
			collect(t, g, &evs, tt.frames...)
			if got := types(evs); !slices.Equal(got, tt.want) {
				t.Fatalf("events\n%v\nwant\n%v", got, tt.want)
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
			if tt.output != "" && (len(last.Output) != 1 || last.Output[0].Content[0].Text != tt.output) {
				t.Fatalf("output %+v, want %q", last.Output, tt.output)
			}
			if tt.name == "tool call" && (len(last.Output) != 1 || last.Output[0].CallID != "call_1" || last.Output[0].Arguments != `{"a":1}` || last.Output[0].Name != "get") {
				t.Fatalf("tool call output %+v", last.Output)
			}
		})
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
	collect(t, h, &rest, chunk(`{"choices":[{"index":0,"delta":{"content":"ef"},"finish_reason":"stop"}]}`), schemas.Frame{Type: schemas.FrameDone, Payload: []byte(`{}`)})
	if rest[0].SequenceNumber != len(first) || rest[0].Type != "response.output_text.delta" {
		t.Fatalf("first event after replay %+v", rest[0])
	}
	end := rest[len(rest)-1].Response
	if end.Output[0].Content[0].Text != "abcdef" || end.Output[0].ID != first[2].Item.ID || end.Usage.OutputTokens != 3 {
		t.Fatalf("after replay: %+v", end.Output)
	}
}
