package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func TestChatNonStream(t *testing.T) {
	e := newEngine(t, fastConfig())
	res := mustGen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"unknown":{"x":1}}`, nil)
	var c chatCompletion
	decodeStrict(t, res.Response, &c)
	if c.ID != "chatcmpl-req1" || c.Object != "chat.completion" || c.Model != "sim" || c.Created == 0 {
		t.Errorf("header: %+v", c)
	}
	if len(c.Choices) != 1 {
		t.Fatalf("choices: %s", res.Response)
	}
	ch := c.Choices[0]
	if ch.Index != 0 || ch.Message.Role != "assistant" || string(ch.Logprobs) != "null" || ch.FinishReason != "stop" {
		t.Errorf("choice: %+v", ch)
	}
	// ChatML: 4 template tokens and the role per message, 3 for the generation prompt
	wantPrompt := 3 + (4 + 1 + countTokens(t, "Be brief.")) + (4 + 1 + countTokens(t, "Hello there"))
	u := c.Usage
	if u == nil || u.PromptTokens != wantPrompt || u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.PromptTokensDetails == nil {
		t.Fatalf("usage %+v, want %d prompt tokens", u, wantPrompt)
	}
	if u.CompletionTokens < 20 || u.CompletionTokens > 200 {
		t.Errorf("natural length %d outside 20..200", u.CompletionTokens)
	}
	if n := countTokens(t, ch.Message.Content); n != u.CompletionTokens {
		t.Errorf("text %q has %d tokens, usage says %d", ch.Message.Content, n, u.CompletionTokens)
	}
	if !strings.HasSuffix(ch.Message.Content, ".") {
		t.Errorf("natural end without a full stop: %q", ch.Message.Content)
	}
	if res.Usage != *u && res.Usage.PromptTokens != u.PromptTokens {
		t.Errorf("Result.Usage %+v != %+v", res.Usage, *u)
	}
	// the array-of-parts form counts the same
	res2 := mustGen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"system","content":[{"type":"text","text":"Be brief."}]},{"role":"user","content":[{"type":"text","text":"Hello there"}]}]}`, nil)
	if res2.Usage.PromptTokens != wantPrompt {
		t.Errorf("parts form: %d prompt tokens, want %d", res2.Usage.PromptTokens, wantPrompt)
	}
}

func TestCompletionNonStream(t *testing.T) {
	e := newEngine(t, fastConfig())
	tests := []struct {
		name        string
		body        string
		prompt      int // total prompt tokens
		choices     int
		completion  int // per choice
		finish      string
		cachedAbove int
	}{
		{"string default max_tokens 16", `{"model":"sim","prompt":"Once upon a time"}`, countTokens(t, "Once upon a time"), 1, 16, "length", -1},
		{"array of strings n=2", `{"model":"sim","prompt":["a b c","d e"],"n":2,"max_tokens":5}`, 5, 4, 5, "length", -1},
		{"tokens", `{"model":"sim","prompt":[1,2,3,4],"max_tokens":3}`, 4, 1, 3, "length", -1},
		{"token arrays", `{"model":"sim","prompt":[[1,2,3],[4,5]],"max_tokens":2}`, 5, 2, 2, "length", -1},
		{"ignore_eos", `{"model":"sim","prompt":"x","max_tokens":300,"ignore_eos":true}`, 1, 1, 300, "length", -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := mustGen(t, e, schemas.KindCompletion, tc.body, nil)
			var c textCompletion
			decodeStrict(t, res.Response, &c)
			if c.ID != "cmpl-req1" || c.Object != "text_completion" || c.Model != "sim" {
				t.Errorf("header %+v", c)
			}
			if len(c.Choices) != tc.choices {
				t.Fatalf("%d choices, want %d: %s", len(c.Choices), tc.choices, res.Response)
			}
			for i, ch := range c.Choices {
				if ch.Index != i || ch.FinishReason != tc.finish || string(ch.Logprobs) != "null" {
					t.Errorf("choice %d: %+v", i, ch)
				}
				if n := countTokens(t, ch.Text); n != tc.completion {
					t.Errorf("choice %d: %d tokens in %q, want %d", i, n, ch.Text, tc.completion)
				}
			}
			if c.Usage.PromptTokens != tc.prompt || c.Usage.CompletionTokens != tc.choices*tc.completion {
				t.Errorf("usage %+v", c.Usage)
			}
		})
	}
}

func TestChatStream(t *testing.T) {
	e := newEngine(t, fastConfig())
	for _, usage := range []string{"", `,"stream_options":{"include_usage":true}`, `,"stream_options":{}`, `,"stream_options":{"include_usage":false}`} {
		t.Run("options"+usage, func(t *testing.T) {
			sink := &recSink{}
			body := `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"stream":true,"seed":7` + usage + `}`
			res := mustGen(t, e, schemas.KindChat, body, sink)
			if res.Response != nil {
				t.Errorf("stream with a Response")
			}
			lines := sink.lines()
			var content strings.Builder
			var id string
			var created int64
			finished, usageSeen := false, false
			for i, l := range lines {
				var c chatChunk
				decodeStrict(t, []byte(l), &c)
				if strings.Contains(l, `"usage":null`) || strings.Contains(l, `"error"`) {
					t.Errorf("chunk %d: %s", i, l)
				}
				if i == 0 {
					id, created = c.ID, c.Created
				}
				if c.ID != id || c.Created != created || c.Object != "chat.completion.chunk" || c.Model != "sim" || !strings.HasPrefix(id, "chatcmpl-") {
					t.Errorf("chunk %d header: %s", i, l)
				}
				if usageSeen {
					t.Errorf("chunk after the usage chunk: %s", l)
				}
				if c.Usage != nil {
					usageSeen = true
					if len(c.Choices) != 0 || !strings.Contains(l, `"choices":[]`) || c.Usage.CompletionTokens != res.Usage.CompletionTokens {
						t.Errorf("usage chunk %s", l)
					}
					continue
				}
				if len(c.Choices) != 1 {
					t.Fatalf("chunk %d: %s", i, l)
				}
				ch := c.Choices[0]
				if finished {
					t.Errorf("chunk after finish: %s", l)
				}
				switch {
				case i == 0:
					if ch.Delta.Role == nil || *ch.Delta.Role != "assistant" || ch.Delta.Content == nil || *ch.Delta.Content != "" || ch.FinishReason != nil {
						t.Errorf("first chunk %s", l)
					}
				case ch.FinishReason != nil:
					finished = true
					if *ch.FinishReason != "stop" || !strings.Contains(l, `"delta":{}`) {
						t.Errorf("finish chunk %s", l)
					}
				default:
					if ch.Delta.Role != nil || ch.Delta.Content == nil || !strings.Contains(l, `"logprobs":null,"finish_reason":null`) {
						t.Errorf("content chunk %s", l)
					}
					content.WriteString(*ch.Delta.Content)
				}
			}
			wantUsage := usage != "" && !strings.Contains(usage, "false")
			if !finished || usageSeen != wantUsage {
				t.Errorf("finished %v, usage chunk %v (want %v)", finished, usageSeen, wantUsage)
			}
			if n := countTokens(t, content.String()); n != res.Usage.CompletionTokens {
				t.Errorf("streamed %d tokens, usage %d", n, res.Usage.CompletionTokens)
			}
			// the same as without streaming
			plain := mustGen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"seed":7}`, nil)
			var c chatCompletion
			decodeStrict(t, plain.Response, &c)
			if c.Choices[0].Message.Content != content.String() {
				t.Errorf("stream %q != non-stream %q", content.String(), c.Choices[0].Message.Content)
			}
		})
	}
}

func TestCompletionStream(t *testing.T) {
	e := newEngine(t, fastConfig())
	sink := &recSink{}
	res := mustGen(t, e, schemas.KindCompletion, `{"model":"sim","prompt":"Hello","max_tokens":10,"stream":true,"stream_options":{"include_usage":true}}`, sink)
	lines := sink.lines()
	if len(lines) != 11 {
		t.Fatalf("%d chunks, want 10 + usage: %q", len(lines), lines)
	}
	var text strings.Builder
	for i, l := range lines[:10] {
		var c textChunk
		decodeStrict(t, []byte(l), &c)
		if c.Object != "text_completion" || len(c.Choices) != 1 || c.Choices[0].Index != 0 || string(c.Choices[0].Logprobs) != "null" {
			t.Errorf("chunk %s", l)
		}
		if (c.Choices[0].FinishReason != nil) != (i == 9) {
			t.Errorf("finish reason in chunk %d: %s", i, l)
		}
		text.WriteString(c.Choices[0].Text)
	}
	if !strings.Contains(lines[9], `"finish_reason":"length"`) {
		t.Errorf("last chunk %s", lines[9])
	}
	var u textChunk
	decodeStrict(t, []byte(lines[10]), &u)
	if u.Usage == nil || u.Usage.CompletionTokens != 10 || res.Usage.CompletionTokens != 10 || !strings.Contains(lines[10], `"choices":[]`) {
		t.Errorf("usage chunk %s, result %+v", lines[10], res.Usage)
	}
	if countTokens(t, text.String()) != 10 {
		t.Errorf("text %q", text.String())
	}
}

func TestStreamN2Interleaves(t *testing.T) {
	e := newEngine(t, fastConfig())
	sink := &recSink{}
	mustGen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"stream":true,"n":2,"max_tokens":8,"ignore_eos":true}`, sink)
	texts := map[int]string{}
	mixed := 0
	sink.mu.Lock()
	calls := sink.calls
	sink.mu.Unlock()
	for _, call := range calls {
		seen := map[int]bool{}
		for _, l := range call {
			var c chatChunk
			decodeStrict(t, []byte(l), &c)
			idx := c.Choices[0].Index
			seen[idx] = true
			if c.Choices[0].Delta.Content != nil {
				texts[idx] += *c.Choices[0].Delta.Content
			}
		}
		if seen[0] && seen[1] {
			mixed++
		}
	}
	if len(texts) != 2 || texts[0] == texts[1] || countTokens(t, texts[0]) != 8 || countTokens(t, texts[1]) != 8 {
		t.Errorf("texts %v", texts)
	}
	if mixed < 8 {
		t.Errorf("only %d of %d sink calls carry both choices", mixed, len(calls))
	}
}

func TestStopStrings(t *testing.T) {
	e := newEngine(t, fastConfig())
	base := `{"model":"sim","messages":[{"role":"user","content":"Hi"}],"seed":42,"max_tokens":60,"ignore_eos":true`
	full := mustGen(t, e, schemas.KindChat, base+`}`, nil)
	var c chatCompletion
	decodeStrict(t, full.Response, &c)
	text := c.Choices[0].Message.Content
	// a stop string spanning two words in the middle of the text
	ws := strings.SplitAfter(text, " ")
	pre := strings.Join(ws[:20], "")
	stop := ws[20] + ws[21][:2]
	cut := strings.Index(text, stop)
	if cut < 0 || cut > len(pre) {
		t.Fatalf("bad test setup: %q in %q", stop, text)
	}
	for _, tc := range []struct {
		name, extra, want string
	}{
		{"string", `,"stop":` + jsonString(stop), text[:cut]},
		{"array", `,"stop":["zzzz",` + jsonString(stop) + `]`, text[:cut]},
		{"include", `,"stop":` + jsonString(stop) + `,"include_stop_str_in_output":true`, text[:cut+len(stop)]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := mustGen(t, e, schemas.KindChat, base+tc.extra+`}`, nil)
			var c chatCompletion
			decodeStrict(t, res.Response, &c)
			if got := c.Choices[0].Message.Content; got != tc.want || c.Choices[0].FinishReason != "stop" {
				t.Errorf("got %q (%s), want %q", got, c.Choices[0].FinishReason, tc.want)
			}
			sink := &recSink{}
			mustGen(t, e, schemas.KindChat, base+tc.extra+`,"stream":true}`, sink)
			var streamed strings.Builder
			for _, l := range sink.lines() {
				var ch chatChunk
				decodeStrict(t, []byte(l), &ch)
				if d := ch.Choices[0].Delta.Content; d != nil {
					streamed.WriteString(*d)
				}
			}
			if streamed.String() != tc.want {
				t.Errorf("streamed %q, want %q", streamed.String(), tc.want)
			}
		})
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestLengths(t *testing.T) {
	e := newEngine(t, fastConfig())
	msgs := `"messages":[{"role":"user","content":"Hi"}]`
	for _, tc := range []struct {
		body   string
		tokens int // -1: natural, 20..200
		finish string
	}{
		{`{` + msgs + `,"max_tokens":5}`, 5, "length"},
		{`{` + msgs + `,"max_tokens":5,"max_completion_tokens":7}`, 7, "length"},
		{`{` + msgs + `,"max_tokens":300,"ignore_eos":true}`, 300, "length"},
		{`{` + msgs + `,"max_tokens":300}`, -1, "stop"},
		{`{` + msgs + `}`, -1, "stop"},
		{`{` + msgs + `,"max_tokens":300,"min_tokens":250}`, 250, "stop"},
		{`{` + msgs + `,"max_tokens":250,"min_tokens":250}`, 250, "stop"},
	} {
		res := mustGen(t, e, schemas.KindChat, tc.body, nil)
		var c chatCompletion
		decodeStrict(t, res.Response, &c)
		n := res.Usage.CompletionTokens
		if tc.tokens >= 0 && n != tc.tokens || tc.tokens < 0 && (n < 20 || n > 200) || c.Choices[0].FinishReason != tc.finish {
			t.Errorf("%s: %d tokens, %s", tc.body, n, c.Choices[0].FinishReason)
		}
		if countTokens(t, c.Choices[0].Message.Content) != n {
			t.Errorf("%s: text does not have %d tokens", tc.body, n)
		}
	}
}

func TestErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 64
	e := newEngine(t, cfg)
	long := strings.Repeat("word ", 70)
	for _, tc := range []struct {
		kind   schemas.Kind
		body   string
		status int
		param  string
		msg    string
	}{
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"` + long + `"}]}`, 400, "messages",
			"This model's maximum context length is 64 tokens. However, you requested 79 tokens in the messages. Please reduce the length of the messages."},
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":60}`, 400, "messages",
			"This model's maximum context length is 64 tokens. However, you requested 69 tokens (9 in the messages, 60 in the completion). Please reduce the length of the messages or completion."},
		{schemas.KindCompletion, `{"model":"sim","prompt":"` + long[:250] + `"}`, 400, "prompt", " in the messages, 16 in the completion)"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","max_tokens":"many"}`, 400, "max_tokens", "expected an integer"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","max_tokens":0}`, 400, "max_tokens", "Expected a value >= 1"},
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":-1}`, 400, "max_completion_tokens", "Expected a value >= 1"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","n":"2"}`, 400, "n", "expected an integer"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","n":0}`, 400, "n", "Expected a value >= 1"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","n":17}`, 400, "n", "Expected a value <= 16"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","stream":"yes"}`, 400, "stream", "expected a boolean"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","stream":true,"stream_options":{"include_usage":"x"}}`, 400, "stream_options.include_usage", "expected a boolean"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","stream_options":{"include_usage":true}}`, 400, "stream_options", "stream=True"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","stop":5}`, 400, "stop", "expected a string"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","stop":[""]}`, 400, "stop", "empty"},
		{schemas.KindCompletion, `{"model":"sim","prompt":"hi","seed":"s"}`, 400, "seed", "expected an integer"},
		{schemas.KindCompletion, `{"model":"sim","prompt":{}}`, 400, "prompt", "Invalid type"},
		{schemas.KindCompletion, `{"model":"sim","prompt":""}`, 400, "prompt", "empty"},
		{schemas.KindCompletion, `{"model":"sim","prompt":[1,-2]}`, 400, "prompt", "out of vocabulary"},
		{schemas.KindCompletion, `{"model":"sim"}`, 400, "prompt", "Missing required"},
		{schemas.KindChat, `{"model":"sim","messages":"hi"}`, 400, "messages", "array"},
		{schemas.KindChat, `{"model":"sim","messages":[]}`, 400, "messages", "empty array"},
		{schemas.KindChat, `{"model":"sim","messages":[{"content":"hi"}]}`, 400, "messages[0].role", "Missing required"},
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content", "Invalid type"},
		{schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, 400, "messages[0].content[0].text", "expected a string"},
		{schemas.KindChat, `{"model":"sim",`, 400, "", "could not parse the JSON body"},
		{schemas.KindChat, `[1]`, 400, "", "JSON object"},
		{schemas.KindChat, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "model", "The model `nope` does not exist."},
	} {
		_, err := gen(t, e, tc.kind, tc.body, nil)
		if err == nil {
			t.Errorf("%s: no error", tc.body)
			continue
		}
		se := asError(t, err)
		param := ""
		if se.Body.Param != nil {
			param = *se.Body.Param
		}
		if se.Status != tc.status || param != tc.param || !strings.Contains(se.Body.Message, tc.msg) {
			t.Errorf("%.80s: got %d param %q %q", tc.body, se.Status, param, se.Body.Message)
		}
		if tc.status == 404 && (se.Body.Code == nil || *se.Body.Code != "model_not_found") {
			t.Errorf("404 code %v", se.Body.Code)
		}
	}
	// the model from the request header wins, and aliases are served
	cfg.ServedNames = []string{"alias"}
	e2 := newEngine(t, cfg)
	res, err := e2.Generate(context.Background(), &engine.Request{ID: "x", Kind: schemas.KindCompletion, Model: "alias", Body: []byte(`{"model":"other","prompt":"hi","max_tokens":1}`)}, nil)
	if err != nil || !strings.Contains(string(res.Response), `"model":"alias"`) {
		t.Errorf("alias: %v %s", err, res.Response)
	}
}

func TestDeterministic(t *testing.T) {
	e := newEngine(t, fastConfig())
	text := func(body string) string {
		res := mustGen(t, e, schemas.KindCompletion, body, nil)
		var c textCompletion
		decodeStrict(t, res.Response, &c)
		return c.Choices[0].Text
	}
	a := text(`{"prompt":"one","seed":1,"max_tokens":30}`)
	if b := text(`{"prompt":"two two","seed":1,"max_tokens":30}`); a != b {
		t.Errorf("same seed, different text: %q %q", a, b)
	}
	if b := text(`{"prompt":"one","seed":2,"max_tokens":30}`); a == b {
		t.Errorf("different seeds, same text %q", a)
	}
	// no seed: a hash of the prompt
	if x, y := text(`{"prompt":"one","max_tokens":30}`), text(`{"prompt":"one","max_tokens":30}`); x != y {
		t.Errorf("same prompt, different text: %q %q", x, y)
	}
	if x, y := text(`{"prompt":"one","max_tokens":30}`), text(`{"prompt":"two","max_tokens":30}`); x == y {
		t.Errorf("different prompts, same text %q", x)
	}
}

// Every generated text must tokenize back to completion_tokens.
func TestTokenCountsExact(t *testing.T) {
	e := newEngine(t, fastConfig())
	for seed := 0; seed < 40; seed++ {
		for _, kind := range []schemas.Kind{schemas.KindChat, schemas.KindCompletion} {
			body := fmt.Sprintf(`{"prompt":"p","messages":[{"role":"user","content":"p"}],"seed":%d,"max_tokens":250}`, seed)
			res := mustGen(t, e, kind, body, nil)
			var c struct {
				Choices []struct {
					Text    string
					Message struct{ Content string }
				}
			}
			json.Unmarshal(res.Response, &c)
			s := c.Choices[0].Text + c.Choices[0].Message.Content
			if n := countTokens(t, s); n != res.Usage.CompletionTokens {
				t.Fatalf("seed %d %s: %d tokens in %q, usage %d", seed, kind, n, s, res.Usage.CompletionTokens)
			}
		}
	}
}

func TestWordsAreSingleTokens(t *testing.T) {
	for _, list := range [][]string{words, starters, spaceStarters, {".", ","}} {
		for _, w := range list {
			if n := countTokens(t, w); n != 1 {
				t.Errorf("%q is %d tokens", w, n)
			}
		}
	}
}

func TestCancelFreesSlot(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeBase = time.Millisecond
	e := newEngine(t, cfg)
	body := `{"messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true,"n":2}`

	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sink := &recSink{onCall: func(n int) error {
			if n == 3 {
				cancel()
			}
			return nil
		}}
		_, err := e.Generate(ctx, &engine.Request{ID: "c", Kind: schemas.KindChat, Body: []byte(body)}, sink)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		wantStats(t, e, func(st engine.Stats) bool { return st.Running == 0 && st.KVCacheUsage == 0 })
		if calls := len(sink.lines()); calls > 3*2+2+4 {
			t.Errorf("%d chunks after cancelling at the 3rd call", calls)
		}
	})
	t.Run("sink error", func(t *testing.T) {
		gone := errors.New("client gone")
		sink := &recSink{onCall: func(n int) error {
			if n >= 5 {
				return gone
			}
			return nil
		}}
		_, err := gen(t, e, schemas.KindChat, body, sink)
		if !errors.Is(err, gone) {
			t.Fatalf("err %v", err)
		}
		if n := len(sink.lines()); n != 5*2+2 {
			t.Errorf("sink called after its error: %d chunks", n)
		}
		wantStats(t, e, func(st engine.Stats) bool { return st.Running == 0 })
	})
	t.Run("waiting", func(t *testing.T) {
		cfg := fastConfig()
		cfg.DecodeBase = time.Millisecond
		cfg.MaxNumSeqs = 1
		e := newEngine(t, cfg)
		go gen(t, e, schemas.KindCompletion, `{"prompt":"a","max_tokens":5000,"ignore_eos":true}`, nil)
		wantStats(t, e, func(st engine.Stats) bool { return st.Running == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := e.Generate(ctx, &engine.Request{Kind: schemas.KindCompletion, Body: []byte(`{"prompt":"b"}`)}, nil)
			errc <- err
		}()
		wantStats(t, e, func(st engine.Stats) bool { return st.Waiting == 1 })
		cancel()
		wantStats(t, e, func(st engine.Stats) bool { return st.Waiting == 0 })
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("err %v", err)
		}
	})
	m := e.Metrics()
	if m.RequestSuccess["abort"] < 4 {
		t.Errorf("metrics %+v", m)
	}
}

// ttft runs one streaming request and returns the time to its first chunk.
func ttft(t *testing.T, e *Engine, body string) (time.Duration, *engine.Result) {
	t.Helper()
	sink := &recSink{}
	start := time.Now()
	res := mustGen(t, e, schemas.KindCompletion, body, sink)
	return sink.times[0].Sub(start), res
}

func TestTimingPrefill(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillBase = 2 * time.Millisecond
	cfg.PrefillPerToken = 50 * time.Microsecond
	cfg.DecodeBase = time.Millisecond
	e := newEngine(t, cfg)
	short, _ := ttft(t, e, `{"prompt":"hello world","max_tokens":2,"stream":true}`)
	longPrompt := strings.Repeat("alpha beta gamma delta ", 250) // 1000 tokens: 50ms of prefill
	long, res := ttft(t, e, `{"prompt":"`+longPrompt+`","max_tokens":2,"stream":true}`)
	if res.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first long prompt cached %d", res.Usage.PromptTokensDetails.CachedTokens)
	}
	if long < short+40*time.Millisecond {
		t.Errorf("TTFT short %v, long %v: prefill does not grow with the prompt", short, long)
	}
	again, res := ttft(t, e, `{"prompt":"`+longPrompt+` and more","max_tokens":2,"stream":true}`)
	cached := res.Usage.PromptTokensDetails.CachedTokens
	if cached < 960 || cached%16 != 0 {
		t.Errorf("repeated prefix: cached_tokens %d", cached)
	}
	if again > long/2 {
		t.Errorf("TTFT with a cached prefix %v, without %v", again, long)
	}
	m := e.Metrics()
	if m.PrefixCacheHits != uint64(cached) || m.PrefixCacheQueries < 2000 || m.PromptTokens != m.PrefixCacheQueries {
		t.Errorf("metrics %+v", m)
	}
	t.Logf("TTFT short %v, long %v, long again %v (cached %d)", short, long, again, cached)
}

func TestTimingDecodeBatch(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeBase = time.Millisecond
	cfg.DecodePerSeq = 500 * time.Microsecond
	e := newEngine(t, cfg)
	perToken := func(batch int) time.Duration {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var total time.Duration
		for i := 0; i < batch; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sink := &recSink{}
				mustGen(t, e, schemas.KindCompletion, `{"prompt":"x","max_tokens":12,"ignore_eos":true,"stream":true}`, sink)
				mu.Lock()
				total += sink.times[len(sink.times)-1].Sub(sink.times[1]) / time.Duration(len(sink.times)-2)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return total / time.Duration(batch)
	}
	one := perToken(1)   // 1.5ms
	many := perToken(24) // 13ms
	if many < 4*one {
		t.Errorf("time per token: batch 1 %v, batch 24 %v", one, many)
	}
	t.Logf("time per token: batch 1 %v, batch 24 %v", one, many)
}

func TestWaitingQueue(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 2
	cfg.DecodeBase = 2 * time.Millisecond
	e := newEngine(t, cfg)
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := mustGen(t, e, schemas.KindCompletion, `{"prompt":"x","max_tokens":15,"ignore_eos":true}`, nil)
			if res.Usage.CompletionTokens != 15 {
				t.Errorf("usage %+v", res.Usage)
			}
		}()
	}
	wantStats(t, e, func(st engine.Stats) bool { return st.Running == 2 && st.Waiting == 3 })
	wg.Wait()
	if s := e.Stats(); s.Running != 0 || s.Waiting != 0 || s.KVCacheUsage != 0 {
		t.Errorf("stats after: %+v", s)
	}
}

func TestPreemption(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.NumBlocks = 20 // 80 tokens
	cfg.MaxModelLen = 64
	cfg.DecodeBase = 500 * time.Microsecond // so that the four requests overlap
	e := newEngine(t, cfg)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"prompt":"request number %d is here","max_tokens":50,"ignore_eos":true}`, i)
			res := mustGen(t, e, schemas.KindCompletion, body, nil)
			var c textCompletion
			decodeStrict(t, res.Response, &c)
			if res.Usage.CompletionTokens != 50 || countTokens(t, c.Choices[0].Text) != 50 {
				t.Errorf("usage %+v", res.Usage)
			}
		}()
	}
	wg.Wait()
	m := e.Metrics()
	if m.Preemptions == 0 || m.RequestSuccess["length"] != 4 || m.GenerationTokens != 200 {
		t.Errorf("metrics %+v", m)
	}
	if s := e.Stats(); s.KVCacheUsage != 0 || s.Running != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestAdapters(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxLoras = 2
	cfg.AdapterLoadTime = 5 * time.Millisecond
	e := newEngine(t, cfg)
	ctx := context.Background()
	start := time.Now()
	if err := e.LoadAdapter(ctx, "a", "/loras/a"); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 5*time.Millisecond {
		t.Errorf("load took no time")
	}
	if err := e.LoadAdapter(ctx, "a", "/loras/a"); err == nil || asError(t, err).Status != 400 {
		t.Errorf("second load of a: %v", err)
	}
	if err := e.LoadAdapter(ctx, "sim", "/x"); err == nil {
		t.Errorf("adapter named like the base model")
	}
	if err := e.LoadAdapter(ctx, "b", "/loras/b"); err != nil {
		t.Fatal(err)
	}
	err := e.LoadAdapter(ctx, "c", "/loras/c")
	if !errors.Is(err, ErrNoAdapterSlot) || asError(t, err).Status != http.StatusConflict || schemas.AsError(err).Body.Code == nil {
		t.Fatalf("third adapter: %v", err)
	}
	if got := strings.Join(e.Models(), ","); got != "sim,a,b" {
		t.Errorf("Models %s", got)
	}
	if s := e.Stats(); strings.Join(s.Adapters, ",") != "a,b" || s.MaxLoras != 2 {
		t.Errorf("Stats %+v", s)
	}
	res := mustGen(t, e, schemas.KindCompletion, `{"model":"a","prompt":"hi"}`, nil)
	if !strings.Contains(string(res.Response), `"model":"a"`) {
		t.Errorf("response %s", res.Response)
	}
	if err := e.UnloadAdapter(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.UnloadAdapter(ctx, "a"); err == nil || asError(t, err).Status != 404 {
		t.Errorf("unload twice: %v", err)
	}
	if _, err := gen(t, e, schemas.KindCompletion, `{"model":"a","prompt":"hi"}`, nil); err == nil || asError(t, err).Status != 404 {
		t.Errorf("request to an unloaded adapter: %v", err)
	}
	if err := e.LoadAdapter(ctx, "c", "/loras/c"); err != nil {
		t.Errorf("load after unload: %v", err)
	}
	if got := strings.Join(e.Models(), ","); got != "sim,b,c" {
		t.Errorf("Models %s", got)
	}
}

// An adapter stands for other weights: its answer to a prompt differs from
// the base model's and from another adapter's, and is the same every time
// (and on another engine that loads it from the same path, so a migrated
// stream goes on exactly). With a seed too: the seed picks the sample, the
// weights what is sampled.
func TestAdapterChangesOutput(t *testing.T) {
	ctx := t.Context()
	cfg := fastConfig()
	e, other := newEngine(t, cfg), newEngine(t, cfg)
	for _, x := range []*Engine{e, other} {
		if err := x.LoadAdapter(ctx, "sql", "/loras/sql"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.LoadAdapter(ctx, "poems", "/loras/poems"); err != nil {
		t.Fatal(err)
	}
	if err := other.LoadAdapter(ctx, "sql-again", "/loras/sql"); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"prompt":"Once upon a time","max_tokens":24,"ignore_eos":true%s}`,
		`{"prompt":"Once upon a time","max_tokens":24,"ignore_eos":true,"seed":7%s}`,
	} {
		text := func(x *Engine, model string) string {
			t.Helper()
			var r textCompletion
			decodeStrict(t, mustGen(t, x, schemas.KindCompletion, fmt.Sprintf(body, `,"model":"`+model+`"`), nil).Response, &r)
			return r.Choices[0].Text
		}
		base, sql, poems := text(e, "sim"), text(e, "sql"), text(e, "poems")
		if sql == base || poems == base || sql == poems {
			t.Fatalf("%s\nbase  %q\nsql   %q\npoems %q: want three different answers", fmt.Sprintf(body, ""), base, sql, poems)
		}
		if again := text(e, "sql"); again != sql {
			t.Errorf("sql twice: %q, then %q", sql, again)
		}
		if there := text(other, "sql"); there != sql {
			t.Errorf("sql on another engine: %q, here %q", there, sql)
		}
		if alias := text(other, "sql-again"); alias != sql {
			t.Errorf("the same weights under another name: %q, want %q", alias, sql)
		}
	}
	// A continuation on the adapter goes on with the adapter's text.
	full := tokensOf(t, e, schemas.KindCompletion, `{"model":"sql","prompt":"Tell me","max_tokens":30,"ignore_eos":true}`, 0)
	const at = 11
	p, _ := json.Marshal("Tell me" + strings.Join(full[:at], ""))
	rest := tokensOf(t, other, schemas.KindCompletion,
		fmt.Sprintf(`{"model":"sql","prompt":%s,"max_tokens":%d,"ignore_eos":true}`, p, 30-at), at)
	if fmt.Sprint(rest) != fmt.Sprint(full[at:]) {
		t.Fatalf("continuation on the adapter:\n%q\nwant\n%q", rest, full[at:])
	}
}

func TestAdapterLoadCancelled(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxLoras = 1
	cfg.AdapterLoadTime = time.Minute
	e := newEngine(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := e.LoadAdapter(ctx, "slow", "/x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled load: %v", err)
	}
	e.mu.Lock()
	n := len(e.adapters)
	e.mu.Unlock()
	if n != 0 || len(e.Models()) != 1 {
		t.Errorf("a cancelled load kept its slot")
	}
}

func TestKVCacheLRU(t *testing.T) {
	kv := newKVCache(4)
	a, b := kv.alloc(), kv.alloc()
	kv.register(a, 11)
	kv.register(b, 22)
	blocks := kv.releaseAll([]int32{a, b}) // b is freed first: evicted first
	if len(blocks) != 0 || kv.free() != 4 || kv.used != 0 || kv.lookup(11) != a || kv.lookup(22) != b {
		t.Fatalf("after release: free %d used %d", kv.free(), kv.used)
	}
	kv.acquire(a) // a hit takes a out of the LRU
	if kv.free() != 3 || kv.used != 1 {
		t.Fatalf("after hit: free %d used %d", kv.free(), kv.used)
	}
	kv.alloc()
	kv.alloc() // the two plain blocks
	if kv.lookup(22) != b {
		t.Fatal("evicted a cached block while plain ones were free")
	}
	if c := kv.alloc(); c != b || kv.lookup(22) != -1 || kv.free() != 0 {
		t.Fatalf("eviction: got block %d, lookup %d", c, kv.lookup(22))
	}
	kv.release(a)
	if kv.lookup(11) != a || kv.free() != 1 {
		t.Fatal("a released cached block left the table")
	}
}

func TestConfig(t *testing.T) {
	e := newEngine(t, Config{})
	c := e.Config()
	if e.Name() != "sim" || c.Model != "sim" || c.MaxNumSeqs != 256 || c.BlockSize != 16 || c.MaxModelLen != 8192 || c.DecodeBase != 0 {
		t.Errorf("filled config %+v", c)
	}
	if _, err := New(Config{MaxModelLen: 1000, NumBlocks: 10, BlockSize: 16}); err == nil {
		t.Error("KV cache smaller than one sequence accepted")
	}
	if _, err := New(Config{DecodeBase: -1}); err == nil {
		t.Error("negative duration accepted")
	}
}

// The sim tells of each change of its model list (an adapter loaded or
// unloaded), and only of changes.
func TestNotifyModels(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxLoras = 1
	e := newEngine(t, cfg)
	var told atomic.Int32
	e.NotifyModels(func() { told.Add(1) })
	ctx := context.Background()
	steps := []struct {
		name string
		do   func() error
		told int32
	}{
		{"load", func() error { return e.LoadAdapter(ctx, "a", "/loras/a") }, 1},
		{"load again (refused)", func() error { _ = e.LoadAdapter(ctx, "a", "/loras/a"); return nil }, 1},
		{"no slot (refused)", func() error { _ = e.LoadAdapter(ctx, "b", "/loras/b"); return nil }, 1},
		{"unload", func() error { return e.UnloadAdapter(ctx, "a") }, 2},
		{"unload again (refused)", func() error { _ = e.UnloadAdapter(ctx, "a"); return nil }, 2},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if n := told.Load(); n != s.told {
			t.Fatalf("after %s: told %d times, want %d", s.name, n, s.told)
		}
	}
}
