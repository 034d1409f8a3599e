package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer"
	"github.com/tokenbus/tokenbus/schemas"
)

// body holds the request fields the sim honours; everything else is ignored.
type body struct {
	Model               *string         `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	N                   *int64          `json:"n"`
	Stop                json.RawMessage `json:"stop"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	Seed           *int64 `json:"seed"`
	IgnoreEOS      *bool  `json:"ignore_eos"`
	MinTokens      *int64 `json:"min_tokens"`
	IncludeStopStr *bool  `json:"include_stop_str_in_output"`
}

type message struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type *string `json:"type"`
	Text *string `json:"text"`
}

// The tokenizer: cl100k_base, compiled in. A Codec is safe for concurrent use.
var codec = sync.OnceValue(func() tokenizer.Codec {
	c, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		panic(err)
	}
	return c
})

// cl100k_base ids used by the ChatML template the sim applies to messages:
// <|im_start|>role\ncontent<|im_end|>\n per message, then
// <|im_start|>assistant\n as the generation prompt.
const (
	tokImStart = 100264
	tokImEnd   = 100265
	tokNewline = 198
	vocabSize  = 100277 // cl100k_base, special tokens included
)

// roleTokens caches the tokens of the usual roles.
var roleTokens = sync.OnceValue(func() map[string][]uint32 {
	m := map[string][]uint32{}
	for _, r := range []string{"system", "developer", "user", "assistant", "tool", "function"} {
		m[r] = encode(nil, r)
	}
	return m
})

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// typeError turns a json error into a 400 naming the field.
func typeError(prefix string, err error) *schemas.Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		param := te.Field
		if prefix != "" {
			param = prefix + "." + param
			if te.Field == "" {
				param = prefix
			}
		}
		if param == "" {
			return schemas.BadRequest("", "the request body must be a JSON object")
		}
		return schemas.BadRequest(param, "invalid type for '%s': expected %s, got %s", param, typeName(te.Type), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return schemas.BadRequest(prefix, "malformed JSON: %v", err)
	}
	return schemas.BadRequest(prefix, "invalid request: %v", err)
}

func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint32:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// encode tokenizes text with cl100k_base and appends the ids.
func encode(dst []uint32, text string) []uint32 {
	if text == "" {
		return dst
	}
	ids, _, err := codec().Encode(text)
	if err != nil { // only in strict UTF-8 mode, which the sim does not use
		return dst
	}
	for _, id := range ids {
		dst = append(dst, uint32(id))
	}
	return dst
}

// chatPrompt applies the chat template to the messages and tokenizes them.
func chatPrompt(raw json.RawMessage) ([]uint32, *schemas.Error) {
	if isNull(raw) {
		return nil, schemas.BadRequest("messages", "'messages' is a required property")
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, schemas.BadRequest("messages", "invalid type for 'messages': expected an array of messages")
	}
	if len(msgs) == 0 {
		return nil, schemas.BadRequest("messages", "'messages' must contain at least one message")
	}
	ids := make([]uint32, 0, 64)
	for i, mraw := range msgs {
		var m message
		if err := json.Unmarshal(mraw, &m); err != nil {
			return nil, typeError(fmt.Sprintf("messages[%d]", i), err)
		}
		if m.Role == nil || *m.Role == "" {
			return nil, schemas.BadRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d]: 'role' is a required property", i)
		}
		content, e := messageText(m.Content, i)
		if e != nil {
			return nil, e
		}
		ids = append(ids, tokImStart)
		if rt, ok := roleTokens()[*m.Role]; ok {
			ids = append(ids, rt...)
		} else {
			ids = encode(ids, *m.Role)
		}
		ids = append(ids, tokNewline)
		ids = encode(ids, content)
		ids = append(ids, tokImEnd, tokNewline)
	}
	ids = append(ids, tokImStart)
	ids = append(ids, roleTokens()["assistant"]...)
	return append(ids, tokNewline), nil
}

// messageText is a message's content: a string, null, or an array of parts
// whose text parts are joined with newlines (as vLLM does for text-only
// templates). Other parts (images...) are ignored.
func messageText(raw json.RawMessage, i int) (string, *schemas.Error) {
	raw = bytes.TrimSpace(raw)
	param := fmt.Sprintf("messages[%d].content", i)
	switch {
	case isNull(raw):
		return "", nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", typeError(param, err)
		}
		return s, nil
	case raw[0] == '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", typeError(param, err)
		}
		var texts []string
		for _, p := range parts {
			if p.Text != nil && (p.Type == nil || *p.Type == "text") {
				texts = append(texts, *p.Text)
			}
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", schemas.BadRequest(param, "invalid type for '%s': expected a string or an array of content parts", param)
}

// completionPrompts parses a completions prompt: a string, an array of
// strings, an array of token ids or an array of arrays of token ids.
func completionPrompts(raw json.RawMessage) ([][]uint32, *schemas.Error) {
	raw = bytes.TrimSpace(raw)
	bad := func() *schemas.Error {
		return schemas.BadRequest("prompt", "invalid type for 'prompt': expected a string, an array of strings, an array of tokens or an array of token arrays")
	}
	if isNull(raw) {
		return nil, schemas.BadRequest("prompt", "'prompt' is a required property")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, bad()
		}
		p, e := stringPrompt(s)
		if e != nil {
			return nil, e
		}
		return [][]uint32{p}, nil
	}
	if raw[0] != '[' {
		return nil, bad()
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, bad()
	}
	if len(elems) == 0 {
		return nil, schemas.BadRequest("prompt", "'prompt' must not be empty")
	}
	switch first := bytes.TrimSpace(elems[0]); {
	case len(first) > 0 && first[0] == '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return nil, bad()
		}
		out := make([][]uint32, len(ss))
		for i, s := range ss {
			p, e := stringPrompt(s)
			if e != nil {
				return nil, e
			}
			out[i] = p
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		var tss [][]int64
		if err := json.Unmarshal(raw, &tss); err != nil {
			return nil, bad()
		}
		out := make([][]uint32, len(tss))
		for i, ts := range tss {
			p, e := tokenPrompt(ts)
			if e != nil {
				return nil, e
			}
			out[i] = p
		}
		return out, nil
	default:
		var ts []int64
		if err := json.Unmarshal(raw, &ts); err != nil {
			return nil, bad()
		}
		p, e := tokenPrompt(ts)
		if e != nil {
			return nil, e
		}
		return [][]uint32{p}, nil
	}
}

func stringPrompt(s string) ([]uint32, *schemas.Error) {
	ids := encode(nil, s)
	if len(ids) == 0 {
		return nil, schemas.BadRequest("prompt", "The decoder prompt cannot be empty")
	}
	return ids, nil
}

func tokenPrompt(ts []int64) ([]uint32, *schemas.Error) {
	if len(ts) == 0 {
		return nil, schemas.BadRequest("prompt", "The decoder prompt cannot be empty")
	}
	ids := make([]uint32, len(ts))
	for i, t := range ts {
		if t < 0 || t >= vocabSize {
			return nil, schemas.BadRequest("prompt", "Token id %d is out of vocabulary", t)
		}
		ids[i] = uint32(t)
	}
	return ids, nil
}

// stops parses stop: a string, an array of strings, or null.
func stops(raw json.RawMessage) ([]string, *schemas.Error) {
	raw = bytes.TrimSpace(raw)
	if isNull(raw) {
		return nil, nil
	}
	var out []string
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, schemas.BadRequest("stop", "invalid type for 'stop': expected a string or an array of strings")
		}
		out = []string{s}
	} else if err := json.Unmarshal(raw, &out); err != nil {
		return nil, schemas.BadRequest("stop", "invalid type for 'stop': expected a string or an array of strings")
	}
	for _, s := range out {
		if s == "" {
			return nil, schemas.BadRequest("stop", "stop cannot contain an empty string.")
		}
	}
	return out, nil
}
