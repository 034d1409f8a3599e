package client

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// A continuation is the request that finishes a stream whose worker failed
// mid-stream, on another worker. There are two.
//
// Exact, when the stream's chunks carried token ids (tokenids.go: vLLM's
// return_token_ids): a completions request whose prompt is the ids of the
// prompt followed by those of every token streamed, for chat and
// completions streams alike, with every other field of the body as it was
// (the sampling parameters: seed, temperature, stop, ignore_eos...) but the
// chat-only ones, max_tokens (chat: max_completion_tokens, else max_tokens;
// completions: vLLM's default 16 when absent; a chat stream without a limit
// sends none, and the vllm engine sets what is left of the context) and
// min_tokens less the tokens generated, and return_token_ids. The engine
// goes on from exactly the tokens the failed worker had: nothing is
// tokenized again. Its chunks are rewritten into the reader's stream
// (splice.go): chat chunks for a chat stream.
//
// Text, otherwise (an engine without token ids: the sim, the openai engine),
// and for what a completions request cannot continue exactly (chat with
// tools, logprobs or a response format, a parser's output such as
// reasoning or tool calls in the stream, echo, logprobs):
//
//   - completions: the prompt followed by the text generated so far;
//   - chat: the messages followed by the partial assistant message, with
//     vLLM's continue_final_message (and add_generation_prompt false);
//
// with max_tokens (or max_completion_tokens) and min_tokens reduced by the
// tokens already generated, every other field as it was. schemas.HdrResume
// carries that count: the sim continues its deterministic output exactly at
// that position. Other engines get a text continuation, which is best
// effort: their tokenizer may split the joined text differently, and
// sampling goes on from the text, not from the state of the failed worker.
//
// A stream that carried tool calls or reasoning (a parser's structured
// output) is not continued at all: it fails with its worker's error, never
// with half a tool call's arguments joined to another attempt's.
//
// Only streams with one choice are continued (n > 1 fails as before), and
// only while they are under Options.MigrationMaxSeqLen chunk frames; a text
// continuation needs one prompt string (prompt arrays, token-id prompts and
// echo fail as before).
type continuation struct {
	body   []byte
	kind   schemas.Kind // of the continuation: completion for an exact one
	tokens int          // completion tokens already streamed
	splice *splice
}

// keptStream is what the chunks kept so far say.
type keptStream struct {
	first  []byte              // the first chunk
	firstL schemas.ChunkLayout // its layout
	text   strings.Builder     // the text generated
	tokens int                 // chunks with text
	parsed bool                // a parser's output (tool calls, reasoning): not continued exactly
	// structured: what was streamed holds tool calls or reasoning, which no
	// continuation can finish: the new engine would call the tool or reason
	// again from the start, and the reader would join half an argument to
	// a whole one. Such a stream is not migrated.
	structured string
	tmpl       []byte // chat: the last content chunk, the shape of a continuation's chunks
}

// read goes through the kept chunks; why is "" or the reason the stream
// cannot be continued at all.
func (fo *failover) read(chat bool) (*keptStream, string) {
	k := &keptStream{}
	var l schemas.ChunkLayout
	var index []byte
	for _, p := range fo.kept {
		for len(p) > 0 {
			line := p
			if i := bytes.IndexByte(p, '\n'); i >= 0 {
				line, p = p[:i], p[i+1:]
			} else {
				p = nil
			}
			if len(line) == 0 {
				continue
			}
			if schemas.ReadChunkLayout(line, &l) != nil {
				return nil, "a chunk is not JSON"
			}
			if k.first == nil {
				k.first = line
				k.firstL = l
				k.firstL.Choice = nil
			}
			for i := range l.Choice {
				c := &l.Choice[i]
				if idx := c.Index.In(line); index != nil && string(idx) != string(index) {
					return nil, "more than one choice"
				} else {
					index = idx
				}
				if !c.FinishReason.Null(line) {
					return nil, "the completion had finished"
				}
				if c.Other {
					k.parsed = true
					if k.structured == "" {
						k.structured = structuredDelta(line[c.Delta.Start:c.Delta.End])
					}
				}
				t := c.Text
				if chat {
					t = c.Content
				}
				if s := rawString(t.In(line)); s != "" {
					k.text.WriteString(s)
					k.tokens++
					if chat && len(l.Choice) == 1 && !c.Role && !c.Other {
						k.tmpl = line
					}
				}
			}
		}
	}
	if k.first == nil {
		return nil, "no chunk kept"
	}
	return k, ""
}

// structuredDelta names what a chat delta carries that a continuation
// cannot finish: "tool calls" (tool_calls, or the legacy function_call),
// "reasoning" (vLLM's reasoning_content, or reasoning); "" when it has
// neither (members that are null or empty, as some servers send, do not
// count).
func structuredDelta(delta []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(delta, &m) != nil {
		return ""
	}
	present := func(k string) bool {
		v := bytes.TrimSpace(m[k])
		return len(v) > 0 && string(v) != "null" && string(v) != "[]" && string(v) != `""`
	}
	switch {
	case present("tool_calls") || present("function_call"):
		return "tool calls"
	case present("reasoning_content") || present("reasoning"):
		return "reasoning"
	}
	return ""
}

// rawString is the value of a JSON string's text (quotes included), "" for
// anything else.
func rawString(v []byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	return schemas.String(v[1 : len(v)-1])
}

// continuation builds the request that continues the stream kept so far;
// why is "" or the reason it cannot.
func (fo *failover) continuation(r *Request) (continuation, string) {
	if fo.over {
		return continuation{}, "stream longer than the migration limit"
	}
	chat := r.Kind == schemas.KindChat
	k, why := fo.read(chat)
	if why != "" {
		return continuation{}, why
	}
	if k.structured != "" {
		return continuation{}, "the stream carried " + k.structured + ", which a continuation cannot finish"
	}
	sp := &splice{id: k.firstL.ID.In(k.first), object: k.firstL.Object.In(k.first), created: k.firstL.Created.In(k.first),
		model: k.firstL.Model.In(k.first), chat: chat, strip: fo.strip}
	if k.tokens == 0 && len(fo.gen) == 0 {
		// Nothing generated yet (a chat stream's role chunk): the request
		// again, its output spliced (its role chunk dropped).
		return continuation{body: r.Body, kind: r.Kind, splice: sp}, ""
	}
	if fo.ids == idsOn && fo.prompt != nil && !fo.badIDs && !k.parsed {
		body, why := exactBody(r.Kind, r.Body, fo.prompt, fo.gen)
		if why == "" {
			sp.exact, sp.base = true, len(fo.gen)
			if chat {
				sp.setTemplate(k.tmpl)
			}
			return continuation{body: body, kind: schemas.KindCompletion, tokens: len(fo.gen), splice: sp}, ""
		}
		if why == "n > 1" || why == "the completion had finished" {
			return continuation{}, why
		}
	}
	text := k.text.String()
	body, why := continuationBody(r.Kind, r.Body, text, k.tokens)
	if why != "" {
		return continuation{}, why
	}
	sp.base = k.tokens
	return continuation{body: body, kind: r.Kind, tokens: k.tokens, splice: sp}, ""
}

// chatOnly are the fields of a chat request that a completions request
// does not take, or that say how to make the prompt, which the token ids
// already are.
var chatOnly = []string{"messages", "max_completion_tokens", "continue_final_message", "add_generation_prompt",
	"chat_template", "chat_template_kwargs", "documents", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
	"top_logprobs", "echo", "add_special_tokens", "mm_processor_kwargs", "media_io_kwargs", "reasoning_effort",
	"include_reasoning", "thinking_token_budget", "return_prompt_text", "functions", "function_call"}

// exactBody is the completions request that continues body (of kind) from
// the token ids of its prompt and of what was generated; why is "" or the
// reason it cannot be continued that way.
func exactBody(kind schemas.Kind, body []byte, prompt, gen []int32) ([]byte, string) {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil, "the body is not a JSON object"
	}
	set := func(k string) bool { v, ok := m[k]; return ok && string(v) != "null" }
	is := func(k, v string) bool { return string(m[k]) == v }
	if n, ok := m["n"]; ok && string(n) != "1" && string(n) != "null" {
		return nil, "n > 1"
	}
	// What a completions request cannot give as the chat stream would have
	// (a parser's tool calls, chat logprobs, a response format), or cannot
	// continue (a grammar restarts, beam search, echo).
	switch {
	case is("use_beam_search", "true"), is("echo", "true"), set("prompt_logprobs"), set("structured_outputs"),
		set("guided_json"), set("guided_regex"), set("guided_choice"), set("guided_grammar"), set("prompt_embeds"):
		return nil, "not continued from token ids"
	case set("response_format"):
		var rf struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(m["response_format"], &rf) != nil || rf.Type != "text" {
			return nil, "a response format"
		}
	}
	maxKey, limit := "max_tokens", 0
	if kind == schemas.KindChat {
		var tools []json.RawMessage
		if set("tools") && json.Unmarshal(m["tools"], &tools) == nil && len(tools) > 0 && !is("tool_choice", `"none"`) {
			return nil, "tools"
		}
		if is("logprobs", "true") {
			return nil, "logprobs"
		}
		if set("max_completion_tokens") {
			maxKey = "max_completion_tokens"
		}
		for _, k := range chatOnly {
			if k != maxKey {
				delete(m, k)
			}
		}
	} else {
		if set("logprobs") || set("suffix") {
			return nil, "logprobs or suffix"
		}
		var one any
		switch json.Unmarshal(m["prompt"], &one); p := one.(type) {
		case string:
		case []any:
			if len(p) > 0 {
				if _, ok := p[0].(float64); !ok {
					return nil, "more than one prompt"
				}
			}
		default:
			return nil, "the prompt is not one prompt"
		}
		limit = 16 // vLLM's default max_tokens for completions
	}
	if set(maxKey) {
		if json.Unmarshal(m[maxKey], &limit) != nil {
			return nil, maxKey + " is not an integer"
		}
	}
	delete(m, maxKey)
	if limit > 0 {
		if limit-len(gen) <= 0 {
			return nil, "the completion had finished"
		}
		m["max_tokens"] = mustJSON(limit - len(gen))
	}
	if set("min_tokens") {
		var mt int
		if json.Unmarshal(m["min_tokens"], &mt) == nil {
			m["min_tokens"] = mustJSON(max(mt-len(gen), 0))
		}
	}
	delete(m, "truncate_prompt_tokens") // the ids are the prompt as it was, truncated or not
	ids := make([]byte, 0, 6*(len(prompt)+len(gen))+2)
	ids = append(ids, '[')
	for i, id := range append(prompt[:len(prompt):len(prompt)], gen...) {
		if i > 0 {
			ids = append(ids, ',')
		}
		ids = strconv.AppendInt(ids, int64(id), 10)
	}
	m["prompt"] = append(ids, ']')
	m["return_token_ids"] = json.RawMessage("true")
	out, err := json.Marshal(m)
	if err != nil {
		return nil, "the body could not be rewritten"
	}
	return out, ""
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
