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
