package responses

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// charCounter is a tokenizer of one token per two characters of the
// messages' contents and arguments (the estimate is bytes of JSON over 4:
// they differ, as a real tokenizer and the estimate do).
func charCounter(calls *int) Counter {
	return func(_ context.Context, body []byte) (int, error) {
		*calls++
		var b struct {
			Messages []chatMessage `json:"messages"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			return 0, err
		}
		n := 0
		for _, m := range b.Messages {
			if m.Content != nil {
				n += len(*m.Content)
			}
			for _, tc := range m.ToolCalls {
				n += len(tc.Function.Arguments)
			}
		}
		return n / 2, nil
	}
}

func noTokenizer(calls *int) Counter {
	return func(context.Context, []byte) (int, error) {
		*calls++
		return 0, errors.New("no /tokenize")
	}
}

// conv is a conversation of items: "s:" system, "u:" user, "a:"
// assistant, "c:" a call, "o:" its output (call ids by order).
func conv(specs ...string) []Item {
	var out []Item
	call := 0
	for _, s := range specs {
		kind, text, _ := strings.Cut(s, ":")
		switch kind {
		case "s", "u", "a":
			role := map[string]string{"s": "system", "u": "user", "a": "assistant"}[kind]
			out = append(out, Item{Type: "message", Role: role, Content: []Content{{Type: "input_text", Text: text}}})
		case "c":
			call++
			out = append(out, Item{Type: "function_call", CallID: "c" + string(rune('0'+call)), Name: "f", Arguments: text})
		case "o":
			out = append(out, Item{Type: "function_call_output", CallID: "c" + string(rune('0'+call)), Output: text})
		}
	}
	return out
}

// texts is what each item says, in order, to compare conversations.
func texts(items []Item) []string {
	var out []string
	for _, it := range items {
		switch it.Type {
		case "message":
			out = append(out, it.Role[:1]+":"+text(it.Content))
		case "function_call":
			out = append(out, "c:"+it.Arguments)
		case "function_call_output":
			out = append(out, "o:"+it.Output)
		}
	}
	return out
}

func TestFit(t *testing.T) {
	long := strings.Repeat("x", 400)
	tests := []struct {
		name       string
		items      []Item
		truncation string
		maxOut     int
		limit      int
		counter    func(*int) Counter
		want       []string // the items kept; nil with code: refused
		code       string
		counts     int // exact counts made
	}{
		{"no limit known", conv("u:"+long, "u:"+long), "", 0, 0, charCounter, []string{"u:" + long, "u:" + long}, "", 0},
		{"far from the limit: no count", conv("u:hi"), "", 0, 10_000, charCounter, []string{"u:hi"}, "", 0},
		{"near, and it fits", conv("u:" + long), "", 100, 400, charCounter, []string{"u:" + long}, "", 1},
		{"disabled: over", conv("u:"+long, "u:"+long), "", 0, 350, charCounter, nil, "context_length_exceeded", 1},
		{"disabled: max_output_tokens counts", conv("u:" + long), "", 200, 300, charCounter, nil, "context_length_exceeded", 1},
		{"disabled: no tokenizer, the engine decides", conv("u:"+long, "u:"+long), "", 0, 150, noTokenizer, []string{"u:" + long, "u:" + long}, "", 1},
		{"auto: the oldest turn dropped, system kept", conv("s:rules", "u:"+long, "a:"+long, "u:"+long, "a:ok", "u:q"), "auto", 0, 600, charCounter,
			[]string{"s:rules", "u:" + long, "a:ok", "u:q"}, "", 2},
		{"auto: a call goes with its output", conv("u:"+long, "c:"+long, "o:"+long, "u:q"), "auto", 0, 250, charCounter,
			[]string{"u:q"}, "", 2},
		{"auto: the last turn never goes", conv("u:"+long, "u:"+long), "auto", 0, 150, charCounter, nil, "context_length_exceeded", 1},
		{"auto: no tokenizer, by the estimate", conv("u:"+long, "u:"+long, "u:q"), "auto", 0, 150, noTokenizer, []string{"u:" + long, "u:q"}, "", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &CreateRequest{Model: "m"}
			if tt.truncation != "" {
				req.Truncation = &tt.truncation
			}
			if tt.maxOut > 0 {
				req.MaxOutputTokens = &tt.maxOut
			}
			calls := 0
			got, err := Fit(context.Background(), req, tt.items, tt.limit, tt.counter(&calls))
			if tt.code != "" {
				e := schemas.AsError(err)
				if err == nil || e.Body.Code == nil || *e.Body.Code != tt.code || e.Status != 400 || *e.Body.Param != "input" {
					t.Fatalf("got %v, want %s", err, tt.code)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if !slices.Equal(texts(got), tt.want) {
				t.Fatalf("kept %q\nwant %q", texts(got), tt.want)
			}
			if calls != tt.counts {
				t.Fatalf("%d counts, want %d", calls, tt.counts)
			}
		})
	}
}

// Truncating a conversation of many items drops them in linear time: each
// drop costs what it drops. (Rebuilding the list at each drop took 4 s for
// 4,000 items; 40,000 would take minutes.)
func TestFitManyItems(t *testing.T) {
	var specs []string
	for i := range 40_000 {
		if i%2 == 0 {
			specs = append(specs, "u:question")
		} else {
			specs = append(specs, "a:answer")
		}
	}
	specs = append(specs, "u:last")
	auto := "auto"
	req := &CreateRequest{Model: "m", Truncation: &auto}
	start := time.Now()
	got, err := Fit(context.Background(), req, conv(specs...), 100, noTokenizer(new(int)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || len(got) > 40 || got[len(got)-1].Role != "user" {
		t.Fatalf("%d items kept", len(got))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("truncating 40,001 items took %v", took)
	}
}
