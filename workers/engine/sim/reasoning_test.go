package sim

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// With ReasoningTokens, reasoning_content comes first (in the stream before
// any content or tool call), is that many tokens, counts in usage, and
// reasoning_effort scales it.
func TestReasoning(t *testing.T) {
	cfg := fastConfig()
	cfg.ReasoningTokens = 12
	e := newEngine(t, cfg)
	for _, tc := range []struct {
		name, body string
		tokens     int
		answer     string // the kind of delta after the reasoning
	}{
		{"text", `{"model":"sim","messages":[{"role":"user","content":"Why?"}],"seed":1}`, 12, "content"},
		{"effort low", `{"model":"sim","messages":[{"role":"user","content":"Why?"}],"reasoning_effort":"low"}`, 6, "content"},
		{"effort high", `{"model":"sim","messages":[{"role":"user","content":"Why?"}],"reasoning_effort":"high"}`, 24, "content"},
		{"effort none", `{"model":"sim","messages":[{"role":"user","content":"Why?"}],"reasoning_effort":"none"}`, 0, "content"},
		{"tool call", chatWithTools(user("weather in Lima"), ""), 12, "tool_calls"},
		{"json", `{"model":"sim","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`, 12, "content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := chatAnswer(t, e, tc.body)
			streamed := chatStream(t, e, tc.body[:len(tc.body)-1]+`,"stream":true,"stream_options":{}}`)
			want := []string{"reasoning", tc.answer}
			if tc.tokens == 0 {
				want = want[1:]
			}
			if !reflect.DeepEqual(streamed.order, want) {
				t.Fatalf("deltas in the order %v, want %v", streamed.order, want)
			}
			if n := countTokens(t, whole.reasoning); n != tc.tokens || streamed.reasoning != whole.reasoning {
				t.Fatalf("reasoning %q (%d tokens, want %d), streamed %q", whole.reasoning, n, tc.tokens, streamed.reasoning)
			}
			if tc.tokens > 0 && !strings.HasSuffix(whole.reasoning, ".") {
				t.Errorf("reasoning %q does not end a sentence", whole.reasoning)
			}
			answerTokens := countTokens(t, whole.content)
			for _, c := range whole.calls {
				answerTokens += countTokens(t, c.Function.Arguments)
			}
			if whole.usage.CompletionTokens != tc.tokens+answerTokens || streamed.usage.CompletionTokens != whole.usage.CompletionTokens {
				t.Errorf("usage %+v / %+v, want %d reasoning + %d answer tokens", whole.usage, streamed.usage, tc.tokens, answerTokens)
			}
			if streamed.content != whole.content || whole.finish != streamed.finish {
				t.Errorf("streamed %+v, whole %+v", streamed, whole)
			}
		})
	}

	// max_tokens within the reasoning: no content (null), finish length.
	a := chatAnswer(t, e, `{"model":"sim","messages":[{"role":"user","content":"Why?"}],"max_tokens":5}`)
	if !a.contentNull || countTokens(t, a.reasoning) != 5 || a.finish != "length" {
		t.Errorf("cut in the reasoning: %+v", a)
	}
	if s := chatStream(t, e, `{"model":"sim","messages":[{"role":"user","content":"Why?"}],"max_tokens":5,"stream":true}`); s.content != "" || s.reasoning != a.reasoning || s.finish != "length" {
		t.Errorf("cut stream: %+v", s)
	}
	// Completions have no reasoning.
	res := mustGen(t, e, schemas.KindCompletion, `{"model":"sim","prompt":"x","max_tokens":3}`, nil)
	if strings.Contains(string(res.Response), "reasoning") {
		t.Errorf("completion %s", res.Response)
	}
	_, err := gen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"}`, nil)
	if err == nil || *asError(t, err).Body.Param != "reasoning_effort" {
		t.Errorf("effort extreme: %v", err)
	}
}

// Off (the default), there is no reasoning_content at all.
func TestReasoningOff(t *testing.T) {
	e := newEngine(t, fastConfig())
	res := mustGen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"}`, nil)
	if strings.Contains(string(res.Response), "reasoning") {
		t.Errorf("%s", res.Response)
	}
	if _, err := New(Config{ReasoningTokens: -1}); err == nil {
		t.Errorf("negative ReasoningTokens accepted")
	}
}

// A continuation of a reasoning model's stream (engine.Request.Resume: the
// content tokens streamed, appended as the final assistant message) goes on
// with the content exactly, without reasoning again.
func TestReasoningResume(t *testing.T) {
	cfg := fastConfig()
	cfg.ReasoningTokens = 5
	e := newEngine(t, cfg)
	orig := chatAnswer(t, e, `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"seed":3,"ignore_eos":true,"logprobs":true}`)
	var content []string
	for _, lp := range orig.logprobs[5:] {
		content = append(content, lp.Token)
	}
	const at = 10
	prefix := strings.Join(content[:at], "")
	body := `{"model":"sim","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":` + jsonQuote(prefix) +
		`}],"continue_final_message":true,"add_generation_prompt":false,"max_tokens":25,"seed":3,"ignore_eos":true,"stream":true}`
	sink := &recSink{}
	res, err := e.Generate(t.Context(), &engine.Request{ID: "r", Kind: schemas.KindChat, Body: []byte(body), Resume: at}, sink)
	if err != nil {
		t.Fatal(err)
	}
	rest := ""
	for _, l := range sink.lines() {
		if strings.Contains(l, "reasoning_content") {
			t.Fatalf("reasoning again: %s", l)
		}
		var c chatChunk
		if err := json.Unmarshal([]byte(l), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				rest += *ch.Delta.Content
			}
		}
	}
	if prefix+rest != orig.content || res.Usage.CompletionTokens != 25 {
		t.Fatalf("continued %q (%d tokens), want %q", prefix+rest, res.Usage.CompletionTokens, orig.content)
	}
}
