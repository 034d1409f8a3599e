package sim

import (
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestTokenizeMatchesUsage(t *testing.T) {
	e := newEngine(t, fastConfig())
	msgs := `[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hello"},{"type":"text","text":"there"}]}]`
	read, rerr := schemas.ReadMessages([]byte(msgs))
	if rerr != nil {
		t.Fatal(rerr)
	}
	for _, tc := range []struct {
		name string
		kind schemas.Kind
		body string
		ids  func() ([]uint32, error)
	}{
		{"chat", schemas.KindChat, `{"messages":` + msgs + `,"max_tokens":3}`,
			func() ([]uint32, error) { return e.TokenizeChat(read, true), nil }},
		{"completion", schemas.KindCompletion, `{"prompt":"The quick brown fox, jumping.","max_tokens":3}`,
			func() ([]uint32, error) { return e.TokenizePrompt("The quick brown fox, jumping."), nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := tc.ids()
			if err != nil {
				t.Fatal(err)
			}
			res := mustGen(t, e, tc.kind, tc.body, &recSink{})
			if res.Usage.PromptTokens != len(ids) {
				t.Errorf("prompt_tokens %d, Tokenize %d ids", res.Usage.PromptTokens, len(ids))
			}
			text, err := e.Detokenize(toInt64(ids))
			if err != nil || text == "" {
				t.Errorf("Detokenize: %q, %v", text, err)
			}
		})
	}
	ids := e.TokenizeChat(read, true)
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n<|im_start|>assistant\n"
	if text, _ := e.Detokenize(toInt64(ids)); text != want {
		t.Errorf("chat template %q, want %q", text, want)
	}
	with := e.TokenizeChat(read, true)
	without := e.TokenizeChat(read, false)
	if len(with)-len(without) != 3 {
		t.Errorf("the generation prompt is %d tokens, want 3", len(with)-len(without))
	}
	if _, err := e.Detokenize([]int64{-1}); err == nil {
		t.Error("token -1: no error")
	}
}

func toInt64(ids []uint32) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}

// acceptSink records the order of Accepted and Chunks calls.
type acceptSink struct {
	recSink
	events []string
}

func (s *acceptSink) Accepted() { s.events = append(s.events, "accepted") }

func (s *acceptSink) Chunks(b []byte) error {
	s.mu.Lock()
	s.events = append(s.events, "chunks")
	s.mu.Unlock()
	return s.recSink.Chunks(b)
}

func TestAccepterAndAdapters(t *testing.T) {
	e := newEngine(t, fastConfig())
	s := &acceptSink{}
	mustGen(t, e, schemas.KindCompletion, `{"prompt":"hi","max_tokens":2,"stream":true}`, s)
	if len(s.events) < 2 || s.events[0] != "accepted" || s.events[1] != "chunks" {
		t.Errorf("events %v: want accepted first, then chunks", s.events)
	}
	bad := &acceptSink{}
	if _, err := gen(t, e, schemas.KindCompletion, `{"prompt":"hi","max_tokens":0,"stream":true}`, bad); err == nil || len(bad.events) != 0 {
		t.Errorf("invalid request: err %v, events %v; want an error and no call", err, bad.events)
	}

	if err := e.LoadAdapter(t.Context(), "a", "/adapters/a"); err != nil {
		t.Fatal(err)
	}
	if got := e.Adapters(); len(got) != 1 || got["a"] != "/adapters/a" {
		t.Errorf("Adapters() = %v", got)
	}
}
