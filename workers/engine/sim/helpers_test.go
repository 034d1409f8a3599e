package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// fastConfig takes no simulated time at all.
func fastConfig() Config {
	c := DefaultConfig()
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq, c.AdapterLoadTime = 0, 0, 0, 0, 0
	return c
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// recSink records every chunk line and the time of every call.
type recSink struct {
	mu     sync.Mutex
	calls  [][]string
	times  []time.Time
	onCall func(call int) error
}

func (s *recSink) Chunks(b []byte) error {
	s.mu.Lock()
	var lines []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		lines = append(lines, string(l))
	}
	s.calls = append(s.calls, lines)
	s.times = append(s.times, time.Now())
	n := len(s.calls)
	f := s.onCall
	s.mu.Unlock()
	if f != nil {
		return f(n)
	}
	return nil
}

func (s *recSink) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		out = append(out, c...)
	}
	return out
}

func gen(t testing.TB, e *Engine, kind schemas.Kind, body string, sink engine.Sink) (*engine.Result, error) {
	t.Helper()
	return e.Generate(context.Background(), &engine.Request{ID: "req1", Kind: kind, Body: []byte(body)}, sink)
}

func mustGen(t testing.TB, e *Engine, kind schemas.Kind, body string, sink engine.Sink) *engine.Result {
	t.Helper()
	res, err := gen(t, e, kind, body, sink)
	if err != nil {
		t.Fatalf("Generate(%s): %v", body, err)
	}
	return res
}

// wantStats waits until e's Stats pass ok.
func wantStats(t testing.TB, e *Engine, ok func(engine.Stats) bool) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if st := e.Stats(); !ok(st) {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
}

func asError(t testing.TB, err error) *schemas.Error {
	t.Helper()
	var se *schemas.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *schemas.Error", err, err)
	}
	return se
}

// OpenAI shapes, as a client would decode them.
type chatCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	} `json:"choices"`
	Usage *schemas.Usage `json:"usage"`
}

type textCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int             `json:"index"`
		Text         string          `json:"text"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	} `json:"choices"`
	Usage *schemas.Usage `json:"usage"`
}

type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *schemas.Usage `json:"usage"`
}

type textChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int             `json:"index"`
		Text         string          `json:"text"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *schemas.Usage `json:"usage"`
}

func decodeStrict(t testing.TB, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

func countTokens(t testing.TB, s string) int {
	t.Helper()
	n, err := codec().Count(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// What a chat answer says, non-stream or accumulated from a stream.
type answer struct {
	reasoning, content string
	contentNull        bool
	calls              []toolCallOut
	finish             string
	usage              schemas.Usage
	logprobs           []chatLogprob
	deltas             int      // stream: content and argument deltas
	order              []string // stream: the kinds of delta in the order they began
}

type toolCallOut struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatLogprob struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []byte  `json:"bytes"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		Bytes   []byte  `json:"bytes"`
	} `json:"top_logprobs"`
}

// bytes decodes as a list of numbers (OpenAI's), not base64.
type byteList []byte

func (b *byteList) UnmarshalJSON(data []byte) error {
	var ints []int
	if err := json.Unmarshal(data, &ints); err != nil {
		return err
	}
	*b = make([]byte, len(ints))
	for i, x := range ints {
		(*b)[i] = byte(x)
	}
	return nil
}

type chatLogprobsOut struct {
	Content []struct {
		Token       string   `json:"token"`
		Logprob     float64  `json:"logprob"`
		Bytes       byteList `json:"bytes"`
		TopLogprobs []struct {
			Token   string   `json:"token"`
			Logprob float64  `json:"logprob"`
			Bytes   byteList `json:"bytes"`
		} `json:"top_logprobs"`
	} `json:"content"`
}

func (l *chatLogprobsOut) entries() []chatLogprob {
	var out []chatLogprob
	for _, c := range l.Content {
		e := chatLogprob{Token: c.Token, Logprob: c.Logprob, Bytes: c.Bytes}
		for _, t := range c.TopLogprobs {
			e.TopLogprobs = append(e.TopLogprobs, struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
				Bytes   []byte  `json:"bytes"`
			}{t.Token, t.Logprob, t.Bytes})
		}
		out = append(out, e)
	}
	return out
}

// chatAnswer runs a non-stream chat request and reads its one choice.
func chatAnswer(t testing.TB, e *Engine, body string) answer {
	t.Helper()
	res := mustGen(t, e, schemas.KindChat, body, nil)
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Role      string        `json:"role"`
				Reasoning *string       `json:"reasoning_content"`
				Content   *string       `json:"content"`
				ToolCalls []toolCallOut `json:"tool_calls"`
			} `json:"message"`
			Logprobs     *chatLogprobsOut `json:"logprobs"`
			FinishReason string           `json:"finish_reason"`
		} `json:"choices"`
		Usage schemas.Usage `json:"usage"`
	}
	decodeStrict(t, res.Response, &c)
	if len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" {
		t.Fatalf("choices: %s", res.Response)
	}
	m := c.Choices[0].Message
	a := answer{calls: m.ToolCalls, finish: c.Choices[0].FinishReason, usage: c.Usage, contentNull: m.Content == nil}
	if m.Reasoning != nil {
		a.reasoning = *m.Reasoning
	}
	if m.Content != nil {
		a.content = *m.Content
	}
	if c.Choices[0].Logprobs != nil {
		a.logprobs = c.Choices[0].Logprobs.entries()
	}
	return a
}

// chatStream runs a streaming chat request of one choice and accumulates
// it as the SDKs do, checking each chunk has vLLM's shape: the role first,
// a tool call's id, type and name (arguments "") in its first delta and
// only its index and arguments after, the finish reason in a chunk of its
// own, usage last.
func chatStream(t testing.TB, e *Engine, body string) answer {
	t.Helper()
	sink := &recSink{}
	res := mustGen(t, e, schemas.KindChat, body, sink)
	var a answer
	roleSeen := false
	began := map[string]bool{}
	begin := func(kind string) {
		if !began[kind] {
			began[kind] = true
			a.order = append(a.order, kind)
		}
	}
	for _, l := range sink.lines() {
		var c struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			Model   string `json:"model"`
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Role      *string `json:"role"`
					Reasoning *string `json:"reasoning_content"`
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    *int    `json:"index"`
						ID       *string `json:"id"`
						Type     *string `json:"type"`
						Function struct {
							Name      *string `json:"name"`
							Arguments *string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				Logprobs     *chatLogprobsOut `json:"logprobs"`
				FinishReason *string          `json:"finish_reason"`
			} `json:"choices"`
			Usage *schemas.Usage `json:"usage"`
		}
		decodeStrict(t, []byte(l), &c)
		if c.Usage != nil {
			a.usage = *c.Usage
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk %s", l)
		}
		ch := c.Choices[0]
		d := ch.Delta
		if !roleSeen {
			if d.Role == nil || *d.Role != "assistant" || d.Content == nil || *d.Content != "" {
				t.Fatalf("first chunk %s", l)
			}
			roleSeen = true
			continue
		}
		if a.finish != "" {
			t.Fatalf("a chunk after the finish: %s", l)
		}
		if ch.Logprobs != nil {
			a.logprobs = append(a.logprobs, ch.Logprobs.entries()...)
		}
		if ch.FinishReason != nil {
			if d.Role != nil || d.Content != nil || d.Reasoning != nil || d.ToolCalls != nil {
				t.Fatalf("finish chunk with a delta: %s", l)
			}
			a.finish = *ch.FinishReason
			continue
		}
		n := 0
		if d.Reasoning != nil {
			n++
			begin("reasoning")
			a.reasoning += *d.Reasoning
		}
		if d.Content != nil {
			n++
			begin("content")
			a.content += *d.Content
			a.deltas++
		}
		for _, tc := range d.ToolCalls {
			n++
			begin("tool_calls")
			if tc.Index == nil || tc.Function.Arguments == nil || len(d.ToolCalls) != 1 {
				t.Fatalf("tool call delta %s", l)
			}
			i := *tc.Index
			switch {
			case i == len(a.calls): // a new call: id, type, name, no arguments yet
				if tc.ID == nil || tc.Type == nil || *tc.Type != "function" || tc.Function.Name == nil || *tc.Function.Arguments != "" {
					t.Fatalf("first delta of call %d: %s", i, l)
				}
				var out toolCallOut
				out.ID, out.Type, out.Function.Name = *tc.ID, *tc.Type, *tc.Function.Name
				a.calls = append(a.calls, out)
			case i == len(a.calls)-1:
				if tc.ID != nil || tc.Type != nil || tc.Function.Name != nil {
					t.Fatalf("later delta of call %d: %s", i, l)
				}
				a.calls[i].Function.Arguments += *tc.Function.Arguments
				a.deltas++
			default:
				t.Fatalf("call index %d after %d calls: %s", i, len(a.calls), l)
			}
		}
		if n != 1 {
			t.Fatalf("chunk with %d deltas: %s", n, l)
		}
	}
	if res.Response != nil || a.finish == "" {
		t.Fatalf("stream without a finish: %q", sink.lines())
	}
	return a
}
