package enginetest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// chunk is an OpenAI chunk object, chat or completion.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index *int    `json:"index"`
		Text  *string `json:"text"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *schemas.Usage  `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// stream is what checkStream read of a stream's chunks.
type stream struct {
	id    string
	texts []string       // per choice index
	usage *schemas.Usage // the usage chunk's, if any
}

// checkStream checks lines, a stream's chunks, as an OpenAI client reads
// them: each an object of kind's chunk type for model, one id throughout,
// n choices, each beginning (chat) with the assistant's role and ending with
// a finish_reason, no chunk of a choice after its finish, and an optional
// usage chunk, with no choices, last.
func checkStream(t *testing.T, kind schemas.Kind, model string, n int, lines []string) stream {
	t.Helper()
	object := map[schemas.Kind]string{schemas.KindChat: "chat.completion.chunk", schemas.KindCompletion: "text_completion"}[kind]
	st := stream{texts: make([]string, n)}
	began := make([]bool, n)
	finished := make([]bool, n)
	if len(lines) == 0 {
		t.Fatal("the stream has no chunks")
	}
	for i, l := range lines {
		var c chunk
		if !strings.HasPrefix(strings.TrimSpace(l), "{") || json.Unmarshal([]byte(l), &c) != nil {
			t.Fatalf("chunk %d is not a JSON object: %q", i, l)
		}
		if i == 0 {
			st.id = c.ID
		}
		switch {
		case len(c.Error) > 0 && string(c.Error) != "null":
			t.Fatalf("chunk %d is an error: %s", i, l)
		case c.ID == "" || c.ID != st.id:
			t.Fatalf("chunk %d has id %q, the stream %q: %s", i, c.ID, st.id, l)
		case c.Object != object || c.Model != model:
			t.Fatalf("chunk %d: object %q model %q, want %q %q: %s", i, c.Object, c.Model, object, model, l)
		case st.usage != nil:
			t.Fatalf("chunk %d after the usage chunk: %s", i, l)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || !strings.Contains(l, `"choices":[]`) {
				t.Fatalf("usage chunk with choices: %s", l)
			}
			st.usage = c.Usage
			continue
		}
		if len(c.Choices) == 0 {
			t.Fatalf("chunk %d has no choices and no usage: %s", i, l)
		}
		for _, ch := range c.Choices {
			if ch.Index == nil || *ch.Index < 0 || *ch.Index >= n {
				t.Fatalf("chunk %d: choice index out of 0..%d: %s", i, n-1, l)
			}
			k := *ch.Index
			if finished[k] {
				t.Fatalf("chunk %d: choice %d after its finish_reason: %s", i, k, l)
			}
			if kind == schemas.KindChat {
				if ch.Delta == nil {
					t.Fatalf("chunk %d: a chat choice without a delta: %s", i, l)
				}
				if !began[k] && (ch.Delta.Role == nil || *ch.Delta.Role != "assistant") {
					t.Fatalf("chunk %d: choice %d does not begin with the assistant's role: %s", i, k, l)
				}
				if ch.Delta.Content != nil {
					st.texts[k] += *ch.Delta.Content
				}
			} else {
				if ch.Text == nil {
					t.Fatalf("chunk %d: a completion choice without text: %s", i, l)
				}
				st.texts[k] += *ch.Text
			}
			began[k] = true
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finished[k] = true
			}
		}
	}
	for k := range n {
		if !finished[k] || st.texts[k] == "" {
			t.Fatalf("choice %d: finished %v, text %q", k, finished[k], st.texts[k])
		}
	}
	return st
}

// whole is an OpenAI response object, chat or completion.
type whole struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *schemas.Usage `json:"usage"`
}

// checkWhole checks a stream:false response as a client reads it, and that
// Result.Usage is the response's.
func checkWhole(t *testing.T, kind schemas.Kind, model string, n int, res *engine.Result) whole {
	t.Helper()
	var w whole
	if res == nil || json.Unmarshal(res.Response, &w) != nil {
		t.Fatalf("Result.Response is not a JSON object: %+v", res)
	}
	object := map[schemas.Kind]string{schemas.KindChat: "chat.completion", schemas.KindCompletion: "text_completion"}[kind]
	if w.ID == "" || w.Object != object || w.Model != model || len(w.Choices) != n {
		t.Fatalf("response id %q object %q model %q with %d choices, want %s for %s with %d: %s",
			w.ID, w.Object, w.Model, len(w.Choices), object, model, n, res.Response)
	}
	for k, ch := range w.Choices {
		text := ch.Text
		if kind == schemas.KindChat {
			if ch.Message == nil || ch.Message.Role != "assistant" {
				t.Fatalf("choice %d has no assistant message: %s", k, res.Response)
			}
			text = ch.Message.Content
		}
		if ch.Index != k || text == nil || *text == "" || ch.FinishReason == "" {
			t.Fatalf("choice %d: %s", k, res.Response)
		}
	}
	if w.Usage == nil || !sameUsage(res.Usage, *w.Usage) {
		t.Fatalf("Result.Usage %+v, the response's %+v", res.Usage, w.Usage)
	}
	return w
}

// checkUsage checks that u counts the completion tokens asked for (the
// suite's requests are ignore_eos: all of max_tokens, times n) and a prompt.
func checkUsage(t *testing.T, u schemas.Usage, completion int) {
	t.Helper()
	if u.CompletionTokens != completion || u.PromptTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v, want %d completion tokens, a prompt and their sum", u, completion)
	}
}

// sameUsage compares usage objects by their JSON (details are pointers).
func sameUsage(a, b schemas.Usage) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// asError returns err as a *schemas.Error of status, or fails.
func asError(t *testing.T, err error, status int) *schemas.Error {
	t.Helper()
	var se *schemas.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *schemas.Error", err, err)
	}
	if se.Status != status {
		t.Fatalf("status %d, want %d: %v", se.Status, status, se)
	}
	return se
}

func param(se *schemas.Error) string {
	if se.Body.Param == nil {
		return ""
	}
	return *se.Body.Param
}

func code(se *schemas.Error) string {
	if se.Body.Code == nil {
		return ""
	}
	return *se.Body.Code
}
