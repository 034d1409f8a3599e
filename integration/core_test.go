package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
)

// chunk is what the tests read of a streamed chunk.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// checkStream verifies one SSE stream like a strict client: one id, role
// first (chat), a finish reason per choice, usage when asked, [DONE] last.
// It returns the content tokens seen per choice.
func checkStream(t testing.TB, s sse, chat bool, n int, wantUsage bool) []int {
	t.Helper()
	if s.Status != 200 {
		t.Fatalf("status %d: %s", s.Status, s.Body)
	}
	if len(s.Events) < 2 || s.Events[len(s.Events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %v", s.Events)
	}
	ids := map[string]bool{}
	tokens := make([]int, n)
	finished := make([]bool, n)
	sawRole := make([]bool, n)
	usageSeen := false
	for i, ev := range s.Events[:len(s.Events)-1] {
		var c chunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %d not JSON: %q", i, ev)
		}
		if c.Error != nil {
			t.Fatalf("error chunk: %s", ev)
		}
		ids[c.ID] = true
		if c.Usage != nil {
			usageSeen = true
			if len(c.Choices) != 0 {
				t.Errorf("usage chunk with choices: %s", ev)
			}
			total := 0
			for _, k := range tokens {
				total += k
			}
			if c.Usage.CompletionTokens != total {
				t.Errorf("usage says %d completion tokens, stream carried %d", c.Usage.CompletionTokens, total)
			}
			continue
		}
		for _, ch := range c.Choices {
			if ch.Index < 0 || ch.Index >= n {
				t.Fatalf("choice index %d out of range", ch.Index)
			}
			if finished[ch.Index] {
				t.Fatalf("choice %d got a chunk after its finish_reason", ch.Index)
			}
			if chat {
				if ch.Delta.Role != nil {
					sawRole[ch.Index] = true
				} else if !sawRole[ch.Index] {
					t.Fatalf("choice %d: first chunk lacks the role: %s", ch.Index, ev)
				}
				if ch.Delta.Content != nil && *ch.Delta.Content != "" {
					tokens[ch.Index]++
				}
			} else if ch.Text != nil && *ch.Text != "" {
				tokens[ch.Index]++
			}
			if ch.FinishReason != nil {
				finished[ch.Index] = true
			}
		}
	}
	if len(ids) != 1 {
		t.Errorf("stream has %d ids, want 1", len(ids))
	}
	for i, f := range finished {
		if !f {
			t.Errorf("choice %d never finished", i)
		}
	}
	if usageSeen != wantUsage {
		t.Errorf("usage chunk present=%v, want %v", usageSeen, wantUsage)
	}
	return tokens
}

func TestOpenAIGoClient(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	ctx := context.Background()
	for _, base := range []string{d.URL + "/v1", d.URL + "/predictions/llama-8b/1.0/v1"} {
		t.Run(strings.TrimPrefix(base, d.URL), func(t *testing.T) {
			c := openaiClient(base)
			// chat, non-stream
			resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:     "llama-8b",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
				MaxTokens: openai.Int(12),
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens != 12 ||
				resp.Choices[0].FinishReason != "length" || resp.Usage.PromptTokens == 0 {
				t.Fatalf("chat completion: %+v", resp)
			}
			// chat, stream with usage
			st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model:         "llama-8b",
				Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to ten")},
				MaxTokens:     openai.Int(20),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			})
			acc := openai.ChatCompletionAccumulator{}
			n := 0
			for st.Next() {
				acc.AddChunk(st.Current())
				n++
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			if n < 20 || acc.Usage.CompletionTokens != 20 || acc.Choices[0].Message.Content == "" {
				t.Fatalf("chat stream: %d chunks, usage %+v, content %q", n, acc.Usage, acc.Choices[0].Message.Content)
			}
			// completions, non-stream and stream
			comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel("llama-8b"),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
				MaxTokens: openai.Int(8),
			})
			if err != nil {
				t.Fatal(err)
			}
			if comp.Object != "text_completion" || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens != 8 {
				t.Fatalf("completion: %+v", comp)
			}
			cs := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel("llama-8b"),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
				MaxTokens: openai.Int(8),
			})
			text := ""
			for cs.Next() {
				for _, ch := range cs.Current().Choices {
					text += ch.Text
				}
			}
			if err := cs.Err(); err != nil || text == "" {
				t.Fatalf("completion stream: %q %v", text, err)
			}
			// models
			models, err := c.Models.List(ctx)
			if err != nil || len(models.Data) == 0 || models.Data[0].ID != "llama-8b" {
				t.Fatalf("models: %+v %v", models, err)
			}
			m, err := c.Models.Get(ctx, "llama-8b")
			if err != nil || m.ID != "llama-8b" {
				t.Fatalf("model: %+v %v", m, err)
			}
		})
	}
}

func TestStreamShapes(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	tests := []struct {
		name  string
		path  string
		body  string
		chat  bool
		n     int
		usage bool
	}{
		{"chat", "/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, true, 1, false},
		{"chat usage", "/v1/chat/completions", `{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, true, 1, true},
		{"chat n=3", "/v1/chat/completions", `{"model":"llama-8b","stream":true,"n":3,"stream_options":{"include_usage":true},"max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`, true, 3, true},
		{"completion", "/v1/completions", `{"model":"llama-8b","stream":true,"max_tokens":5,"prompt":"hello"}`, false, 1, false},
		{"completion 2 prompts n=2", "/v1/completions", `{"model":"llama-8b","stream":true,"n":2,"max_tokens":5,"prompt":["a","b"],"stream_options":{"include_usage":true}}`, false, 4, true},
		{"torchserve form", "/predictions/llama-8b/1.0/v1/completions", `{"model":"llama-8b","stream":true,"max_tokens":5,"prompt":"hello"}`, false, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := post(t, d.URL, tt.path, tt.body)
			if ct := s.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("content type %q body %s", ct, s.Body)
			}
			checkStream(t, s, tt.chat, tt.n, tt.usage)
		})
	}
}

func TestConcurrentStreams(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	const streams = 200
	var wg sync.WaitGroup
	ids := make([]string, streams)
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":32,"ignore_eos":true,"messages":[{"role":"user","content":"request %d"}]}`, i)
			s := post(t, d.URL, "/v1/chat/completions", body)
			if s.Status != 200 {
				errs <- fmt.Errorf("stream %d: status %d %s", i, s.Status, s.Body)
				return
			}
			toks := checkStream(t, s, true, 1, true)
			if toks[0] != 32 {
				errs <- fmt.Errorf("stream %d: %d tokens, want 32", i, toks[0])
			}
			var c chunk
			_ = json.Unmarshal([]byte(s.Events[0]), &c)
			ids[i] = c.ID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("id %q used by two streams", id)
		}
		seen[id] = true
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	tests := []struct {
		name   string
		path   string
		ctype  string
		body   string
		status int
		param  string
	}{
		{"malformed json", "/v1/chat/completions", "application/json", `{"model":`, 400, ""},
		{"bad type", "/v1/chat/completions", "application/json", `{"model":"llama-8b","stream":"yes","messages":[]}`, 400, "stream"},
		{"missing messages", "/v1/chat/completions", "application/json", `{"model":"llama-8b"}`, 400, "messages"},
		{"missing prompt", "/v1/completions", "application/json", `{"model":"llama-8b"}`, 400, "prompt"},
		{"missing model", "/v1/completions", "application/json", `{"prompt":"x"}`, 400, "model"},
		{"unknown model", "/v1/chat/completions", "application/json", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "model"},
		{"unknown model stream", "/v1/chat/completions", "application/json", `{"model":"nope","stream":true,"messages":[{"role":"user","content":"x"}]}`, 404, "model"},
		{"wrong content type", "/v1/chat/completions", "text/plain", `{"model":"llama-8b","messages":[{"role":"user","content":"x"}]}`, 415, ""},
		{"over context length", "/v1/completions", "application/json", `{"model":"llama-8b","prompt":"x","max_tokens":100000}`, 400, ""},
		{"too big", "/v1/completions", "application/json", `{"model":"llama-8b","prompt":"` + strings.Repeat("x", 9<<20) + `"}`, 413, ""},
		{"unknown route", "/v1/nothing", "application/json", `{}`, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", d.URL+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", tt.ctype)
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var buf strings.Builder
			_, _ = fmt.Fprint(&buf, "")
			b := make([]byte, 1<<16)
			n, _ := resp.Body.Read(b)
			body := string(b[:n])
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			e := errorBody(t, body)
			if tt.param != "" && (e.Param == nil || *e.Param != tt.param) {
				t.Errorf("param %v, want %q: %s", e.Param, tt.param, body)
			}
		})
	}
}

// A request for a registered model with no worker is held for one
// (docs/capacity.md) and, when none comes within the cold-start timeout,
// answered 503 with Retry-After; a stream too, with its real status while
// it has not begun (keep-alives off here).
func TestNoWorker503(t *testing.T) {
	t.Parallel()
	d := startDev(t, func(c *program.DevConfig) {
		c.SimWorkers, c.Dispatcher.ColdStartTimeout, c.HTTP.HoldKeepalive = 0, 500*time.Millisecond, -1
	})
	s := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","messages":[{"role":"user","content":"x"}]}`)
	if s.Status != 503 || s.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d retry-after %q: %s", s.Status, s.Header.Get("Retry-After"), s.Body)
	}
	if e := errorBody(t, s.Body); e.Code == nil || *e.Code != "cold_start_timeout" {
		t.Fatalf("code %v: %s", e.Code, s.Body)
	}
	s = post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if s.Status != 503 {
		t.Fatalf("stream: status %d: %s", s.Status, s.Body)
	}
}

func TestQueueFills503(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits out a queue timeout")
	}
	t.Parallel()
	// One worker taking one request at a time, a queue of one, a slow engine.
	d := startDev(t, func(c *program.DevConfig) {
		c.SimWorkers, c.Worker.MaxConcurrency, c.Dispatcher.QueueSize, c.Engine.Sim.DecodeBase = 1, 1, 1, 50*time.Millisecond
	})
	body := `{"model":"llama-8b","stream":true,"max_tokens":40,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`
	hb := watchHeartbeats(t, d.NATSURL)
	results := make(chan sse, 2)
	go func() { results <- post(t, d.URL, "/v1/chat/completions", body) }()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb.running() != 1 {
			return fmt.Errorf("first request not running yet")
		}
		return nil
	})
	go func() { results <- post(t, d.URL, "/v1/chat/completions", body) }() // queued
	testenv.WaitFor(t, 5*time.Second, func() error {
		if q := metricValue(t, d.URL, `tokenbus_dispatcher_queue_depth{model="llama-8b"}`); q != 1 {
			return fmt.Errorf("queue depth %v, want 1", q)
		}
		return nil
	})
	third := post(t, d.URL, "/v1/chat/completions", body) // the queue is full
	if third.Status != 503 {
		t.Fatalf("status %d, want 503: %s", third.Status, third.Body)
	}
	if e := errorBody(t, third.Body); e.Code == nil || *e.Code != "queue_full" || third.Header.Get("Retry-After") == "" {
		t.Fatalf("queue full answer: %s (Retry-After %q)", third.Body, third.Header.Get("Retry-After"))
	}
	for range 2 {
		checkStream(t, <-results, true, 1, false) // the running and the queued one both finish
	}
}

// Not parallel: a bound of about a second, which neighbours would eat into.
func TestClientHangUpFreesEngine(t *testing.T) {
	d := startDev(t, func(c *program.DevConfig) { c.Engine.Sim.DecodeBase = 20 * time.Millisecond })
	hb := watchHeartbeats(t, d.NATSURL)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"llama-8b","stream":true,"max_tokens":2000,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := resp.Body.Read(buf); err != nil { // the stream is flowing
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb.running() != 1 {
			return fmt.Errorf("running %d, want 1", hb.running())
		}
		return nil
	})
	hungUp := time.Now()
	cancel()
	resp.Body.Close()
	testenv.WaitFor(t, 3*time.Second, func() error {
		if n := hb.running(); n != 0 {
			return fmt.Errorf("the engine still runs %d requests", n)
		}
		return nil
	})
	if took := time.Since(hungUp); took > time.Second+200*time.Millisecond {
		t.Errorf("abort took %s, want about a second at most", took)
	}
}

// Not parallel: a bound of 2 s, which neighbours would eat into.
func TestDevStopsFastWithOpenStreams(t *testing.T) {
	d := startDev(t, func(c *program.DevConfig) { c.Engine.Sim.DecodeBase = 20 * time.Millisecond })
	done := make(chan sse, 4)
	for range 4 {
		go func() {
			done <- post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":5000,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`)
		}()
	}
	hb := watchHeartbeats(t, d.NATSURL)
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb.running() != 4 {
			return fmt.Errorf("running %d", hb.running())
		}
		return nil
	})
	if took := d.stop(); took > 2*time.Second {
		t.Fatalf("shutdown took %s with streams open, want < 2s", took)
	}
	for range 4 {
		s := <-done
		// Cut streams still end properly: an error event, then [DONE].
		if s.Status != 200 || len(s.Events) == 0 || s.Events[len(s.Events)-1] != "[DONE]" {
			t.Errorf("a stream cut by shutdown did not end cleanly: status %d, last events %v", s.Status, tail(s.Events, 2))
		}
	}
}

func tail(s []string, n int) []string {
	if len(s) < n {
		return s
	}
	return s[len(s)-n:]
}

func TestRequestIDAndUnknownFields(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	s := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","max_tokens":3,"my_field":{"x":1},"messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "my-req-42")
	if s.Status != 200 || s.Header.Get("X-Request-Id") != "my-req-42" {
		t.Fatalf("status %d, X-Request-Id %q: %s", s.Status, s.Header.Get("X-Request-Id"), s.Body)
	}
	s = post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "bad id with spaces")
	if got := s.Header.Get("X-Request-Id"); got == "" || strings.Contains(got, " ") {
		t.Fatalf("invalid X-Request-Id not replaced: %q", got)
	}
}
