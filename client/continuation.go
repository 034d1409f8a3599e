package client

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// A continuation is the request that finishes a stream whose worker failed
// mid-stream, on another worker:
//
//   - completions: the prompt followed by the text generated so far;
//   - chat: the messages followed by the partial assistant message, with
//     vLLM's continue_final_message (and add_generation_prompt false);
//
// with max_tokens (or max_completion_tokens) and min_tokens reduced by the
// tokens already generated, every other field as it was (seed, ignore_eos,
// stop...). schemas.HdrResume carries that count: the sim continues its
// deterministic output exactly at that position. Other engines get a text
// continuation, which is best effort: their tokenizer may split the joined
// text differently, and sampling goes on from the text, not from the state
// of the failed worker.
//
// Only streams with one choice and one prompt string are continued (n > 1,
// prompt arrays or token-id prompts, and echo fail as before), and only
// while they are under Options.MigrationMaxSeqLen chunk frames.
type continuation struct {
	body   []byte
	tokens int // completion tokens already streamed (chunks with text)
	splice *splice
}

// streamChunk is what a continuation needs of a stream chunk.
type streamChunk struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int     `json:"index"`
		Text  *string `json:"text"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

var errStop = errors.New("stop")

// continuation builds the request that continues the stream kept so far;
// why is "" or the reason it cannot.
func (fo *failover) continuation(r *Request) (continuation, string) {
	if fo.over {
		return continuation{}, "stream longer than the migration limit"
	}
	var (
		text    strings.Builder
		tokens  int
		first   streamChunk
		index   = -1
		why     string
		haveOne bool
	)
	line := func(line []byte) error {
		var ch streamChunk
		if json.Unmarshal(line, &ch) != nil {
			why = "a chunk is not JSON"
			return errStop
		}
		if !haveOne {
			first, haveOne = ch, true
		}
		for _, c := range ch.Choices {
			if index >= 0 && c.Index != index {
				why = "more than one choice"
				return errStop
			}
			index = c.Index
			if c.FinishReason != nil && *c.FinishReason != "" {
				why = "the completion had finished"
				return errStop
			}
			var t string
			switch {
			case c.Text != nil:
				t = *c.Text
			case c.Delta != nil && c.Delta.Content != nil:
				t = *c.Delta.Content
			}
			if t != "" {
				text.WriteString(t)
				tokens++
			}
		}
		return nil
	}
	for _, p := range fo.kept {
		if schemas.ForEachLine(p, line) != nil {
			break
		}
	}
	if why != "" {
		return continuation{}, why
	}
	if !haveOne {
		return continuation{}, "no chunk kept"
	}
	body, why := continuationBody(r.Kind, r.Body, text.String(), tokens)
	if why != "" {
		return continuation{}, why
	}
	return continuation{body: body, tokens: tokens,
		splice: &splice{id: first.ID, created: first.Created, model: first.Model, base: tokens, chat: r.Kind == schemas.KindChat}}, ""
}

// continuationBody is body continued after text (tokens of it).
func continuationBody(kind schemas.Kind, body []byte, text string, tokens int) ([]byte, string) {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil, "the body is not a JSON object"
	}
	if n, ok := m["n"]; ok && string(n) != "1" && string(n) != "null" {
		return nil, "n > 1"
	}
	maxKey, dflt := "max_tokens", 0
	if kind == schemas.KindCompletion {
		if e, ok := m["echo"]; ok && string(e) == "true" {
			return nil, "echo"
		}
		var prompt string
		if json.Unmarshal(m["prompt"], &prompt) != nil {
			return nil, "the prompt is not one string"
		}
		m["prompt"] = mustJSON(prompt + text)
		dflt = 16 // vLLM's default max_tokens for completions
	} else {
		var msgs []json.RawMessage
		if json.Unmarshal(m["messages"], &msgs) != nil {
			return nil, "messages is not an array"
		}
		if cf, ok := m["continue_final_message"]; ok && string(cf) == "true" {
			// The client's own continuation: ours is appended to its last message.
			var last map[string]json.RawMessage
			var content string
			if len(msgs) == 0 || json.Unmarshal(msgs[len(msgs)-1], &last) != nil || json.Unmarshal(last["content"], &content) != nil {
				return nil, "continue_final_message with a final message that is not text"
			}
			last["content"] = mustJSON(content + text)
			msgs[len(msgs)-1] = mustJSON(last)
		} else {
			msgs = append(msgs, mustJSON(map[string]string{"role": "assistant", "content": text}))
		}
		m["messages"] = mustJSON(msgs)
		m["continue_final_message"] = json.RawMessage("true")
		m["add_generation_prompt"] = json.RawMessage("false")
		if v, ok := m["max_completion_tokens"]; ok && string(v) != "null" {
			maxKey = "max_completion_tokens"
		}
	}
	limit := dflt
	if v, ok := m[maxKey]; ok && string(v) != "null" {
		if json.Unmarshal(v, &limit) != nil {
			return nil, maxKey + " is not an integer"
		}
	}
	if limit > 0 {
		if limit-tokens <= 0 {
			return nil, "the completion had finished"
		}
		m[maxKey] = mustJSON(limit - tokens)
	}
	if v, ok := m["min_tokens"]; ok && string(v) != "null" {
		var mt int
		if json.Unmarshal(v, &mt) == nil {
			m["min_tokens"] = mustJSON(max(mt-tokens, 0))
		}
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, "the body could not be rewritten"
	}
	return out, ""
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v) // strings, ints, maps of them: cannot fail
	return b
}
