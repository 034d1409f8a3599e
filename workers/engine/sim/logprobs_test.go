package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// Chat logprobs: one entry per token, its text and bytes, the top
// alternatives best first (the token drawn), the same whole and streamed
// (each delta carries its token's entry).
func TestChatLogprobs(t *testing.T) {
	cfg := fastConfig()
	cfg.ReasoningTokens = 3
	e := newEngine(t, cfg)
	for _, tc := range []struct {
		name, body string
		top        int
	}{
		{"text", `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":3,"max_tokens":30}`, 3},
		{"no top", `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"logprobs":true,"max_tokens":30}`, 0},
		{"stop strings", `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":2,"stop":["zzz"],"max_tokens":30}`, 2},
		{"tool call", chatWithTools(user("time in Lima"), `,"logprobs":true,"top_logprobs":5`), 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := chatAnswer(t, e, tc.body)
			streamed := chatStream(t, e, tc.body[:len(tc.body)-1]+`,"stream":true}`)
			text := whole.reasoning + whole.content
			for _, c := range whole.calls {
				text += c.Function.Arguments
			}
			if len(whole.logprobs) != whole.usage.CompletionTokens {
				t.Fatalf("%d logprobs for %d tokens", len(whole.logprobs), whole.usage.CompletionTokens)
			}
			var joined strings.Builder
			for _, lp := range whole.logprobs {
				joined.WriteString(lp.Token)
				if string(lp.Bytes) != lp.Token || lp.Logprob >= 0 || len(lp.TopLogprobs) != tc.top {
					t.Fatalf("entry %+v", lp)
				}
				seen := map[string]bool{}
				for i, alt := range lp.TopLogprobs {
					if i == 0 && (alt.Token != lp.Token || alt.Logprob != lp.Logprob) || i > 0 && alt.Logprob >= lp.TopLogprobs[i-1].Logprob ||
						seen[alt.Token] || string(alt.Bytes) != alt.Token {
						t.Fatalf("alternatives %+v", lp.TopLogprobs)
					}
					seen[alt.Token] = true
				}
			}
			if joined.String() != text {
				t.Fatalf("tokens %q, text %q", joined.String(), text)
			}
			if len(streamed.logprobs) != len(whole.logprobs) {
				t.Fatalf("streamed %d logprobs, whole %d", len(streamed.logprobs), len(whole.logprobs))
			}
			for i := range whole.logprobs {
				if streamed.logprobs[i].Token != whole.logprobs[i].Token || streamed.logprobs[i].Logprob != whole.logprobs[i].Logprob {
					t.Fatalf("entry %d: streamed %+v, whole %+v", i, streamed.logprobs[i], whole.logprobs[i])
				}
			}
		})
	}
	// Without logprobs they are null.
	res := mustGen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"max_tokens":3}`, nil)
	if !strings.Contains(string(res.Response), `"logprobs":null`) {
		t.Errorf("%s", res.Response)
	}
}

// Completions logprobs: vLLM's {text_offset, token_logprobs, tokens,
// top_logprobs} per choice, streamed per chunk.
func TestCompletionLogprobs(t *testing.T) {
	e := newEngine(t, fastConfig())
	type lps struct {
		TextOffset    []int                `json:"text_offset"`
		TokenLogprobs []float64            `json:"token_logprobs"`
		Tokens        []string             `json:"tokens"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	}
	body := `{"model":"sim","prompt":"Once","max_tokens":12,"logprobs":2,"n":2}`
	res := mustGen(t, e, schemas.KindCompletion, body, nil)
	var c struct {
		Choices []struct {
			Index    int    `json:"index"`
			Text     string `json:"text"`
			Logprobs lps    `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(res.Response, &c); err != nil {
		t.Fatal(err)
	}
	for _, ch := range c.Choices {
		l := ch.Logprobs
		if len(l.Tokens) != 12 || len(l.TokenLogprobs) != 12 || len(l.TextOffset) != 12 || len(l.TopLogprobs) != 12 {
			t.Fatalf("choice %d: %+v", ch.Index, l)
		}
		if strings.Join(l.Tokens, "") != ch.Text {
			t.Errorf("tokens %q, text %q", l.Tokens, ch.Text)
		}
		off := 0
		for i, tok := range l.Tokens {
			if l.TextOffset[i] != off || len(l.TopLogprobs[i]) != 2 || l.TopLogprobs[i][tok] != l.TokenLogprobs[i] {
				t.Fatalf("token %d %q: offset %d, top %v, logprob %v", i, tok, l.TextOffset[i], l.TopLogprobs[i], l.TokenLogprobs[i])
			}
			off += len(tok)
		}
	}
	sink := &recSink{}
	mustGen(t, e, schemas.KindCompletion, body[:len(body)-1]+`,"stream":true}`, sink)
	var tokens [2][]string
	for _, line := range sink.lines() {
		var ch struct {
			Choices []struct {
				Index    int    `json:"index"`
				Text     string `json:"text"`
				Logprobs *lps   `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatal(err)
		}
		for _, x := range ch.Choices {
			if x.Logprobs == nil || strings.Join(x.Logprobs.Tokens, "") != x.Text || x.Logprobs.TextOffset[0] != len(strings.Join(tokens[x.Index], "")) {
				t.Fatalf("chunk %s", line)
			}
			tokens[x.Index] = append(tokens[x.Index], x.Logprobs.Tokens...)
		}
	}
	for i := range 2 {
		if strings.Join(tokens[i], "") != c.Choices[i].Text {
			t.Errorf("choice %d streamed %q, whole %q", i, tokens[i], c.Choices[i].Text)
		}
	}
	// logprobs: 0 is the token drawn alone.
	res = mustGen(t, e, schemas.KindCompletion, `{"model":"sim","prompt":"Once","max_tokens":2,"logprobs":0}`, nil)
	if !strings.Contains(string(res.Response), `"top_logprobs":[{"`) || strings.Count(string(res.Response), `":-`) != 2 {
		t.Errorf("logprobs 0: %s", res.Response)
	}
}

func TestLogprobsErrors(t *testing.T) {
	e := newEngine(t, fastConfig())
	for _, tc := range []struct {
		kind        schemas.Kind
		body, param string
	}{
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, "top_logprobs"},
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, "top_logprobs"},
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1}`, "top_logprobs"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"x","logprobs":21}`, "logprobs"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"x","logprobs":-1}`, "logprobs"},
	} {
		_, err := gen(t, e, tc.kind, tc.body, nil)
		if err == nil {
			t.Errorf("%s: accepted", tc.body)
			continue
		}
		if se := asError(t, err); se.Status != 400 || *se.Body.Param != tc.param {
			t.Errorf("%s: %s", tc.body, se.JSON())
		}
	}
}
