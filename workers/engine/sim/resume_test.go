package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// A continuation (engine.Request.Resume, with the text generated so far
// appended to the prompt, or for chat as the final assistant message with
// continue_final_message) produces exactly the rest of the original output:
// the same text, max_tokens less the tokens already made, usage counting
// only the new tokens. With or without a seed (without one the seed is the
// original prompt's: the continuation's prompt less its last Resume tokens).
func TestResumeContinuesExactly(t *testing.T) {
	e := newEngine(t, fastConfig())
	for _, tc := range []struct {
		name string
		kind schemas.Kind
		orig string
		cont func(text string, left int) string
	}{
		{"completion, no seed", schemas.KindCompletion, `{"prompt":"Tell me","max_tokens":40,"ignore_eos":true}`,
			func(text string, left int) string {
				p, _ := json.Marshal("Tell me" + text)
				return fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"ignore_eos":true}`, p, left)
			}},
		{"chat, seed", schemas.KindChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"seed":3,"ignore_eos":true}`,
			func(text string, left int) string {
				c, _ := json.Marshal(text)
				return fmt.Sprintf(`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":%s}],"continue_final_message":true,"add_generation_prompt":false,"max_tokens":%d,"seed":3,"ignore_eos":true}`, c, left)
			}},
		{"chat, no seed", schemas.KindChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"ignore_eos":true}`,
			func(text string, left int) string {
				c, _ := json.Marshal(text)
				return fmt.Sprintf(`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":%s}],"continue_final_message":true,"add_generation_prompt":false,"max_tokens":%d,"ignore_eos":true}`, c, left)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full := tokensOf(t, e, tc.kind, tc.orig, 0)
			if len(full) != 40 {
				t.Fatalf("original: %d tokens", len(full))
			}
			const at = 17
			text := ""
			for _, tok := range full[:at] {
				text += tok
			}
			rest := tokensOf(t, e, tc.kind, tc.cont(text, 40-at), at)
			if fmt.Sprint(rest) != fmt.Sprint(full[at:]) {
				t.Fatalf("continuation:\n%q\nwant\n%q", rest, full[at:])
			}
		})
	}
}

// tokensOf runs a non-streaming request and returns its tokens (each of the
// sim's tokens is one word or punctuation mark, so the text splits back).
func tokensOf(t *testing.T, e *Engine, kind schemas.Kind, body string, resume int) []string {
	t.Helper()
	var sink recSink
	b := []byte(body[:len(body)-1] + `,"stream":true}`)
	res, err := e.Generate(context.Background(), &engine.Request{ID: "r", Kind: kind, Body: b, Resume: resume}, &sink)
	if err != nil {
		t.Fatal(err)
	}
	var toks []string
	for _, l := range sink.lines() {
		if l == "" {
			continue
		}
		var ch streamChunkForTest
		if err := json.Unmarshal([]byte(l), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			if s := c.Text + c.Delta.Content; s != "" {
				toks = append(toks, s)
			}
		}
	}
	if res.Usage.CompletionTokens != len(toks) {
		t.Fatalf("usage %d completion tokens, %d streamed", res.Usage.CompletionTokens, len(toks))
	}
	return toks
}

type streamChunkForTest struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
}
