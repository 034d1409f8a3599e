package schemas

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// refChunk decodes a chunk with encoding/json, the reference for ReadChunk.
type refChunk struct {
	ID      *string `json:"id"`
	Object  *string `json:"object"`
	Choices []struct {
		Index        *int    `json:"index"`
		Delta        *refMsg `json:"delta"`
		Message      *refMsg `json:"message"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *refUsage       `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type refUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type refMsg struct {
	Content          *string `json:"content"`
	ReasoningContent *string `json:"reasoning_content"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

var chunkCases = []string{
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`,
	`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" Hi","logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a \"quoted\" \u00e9 line\n","tool_calls":[{"id":"x","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`,
	`{"id":"c","object":"o","choices":[{"index":0,"delta":{"reasoning_content":"think"},"finish_reason":null}]}`,
	`{"error":{"message":"boom","type":"internal","param":null,"code":500}}`,
	`{"id":"c","error":null,"choices":[]}`,
	`{"id":"c","choices":null,"usage":null}`,
	` { "id" : "c\/d" , "choices" : [ { "index" : 2 , "logprobs" : { "content" : [ { "token" : "x", "logprob" : -1.5e-3 } ] } } ] } `,
	`{"id":"c","choices":[{"index":null,"finish_reason":""}]}`,
	`{"id":"c","choices":[{"index":0}],"nested":[[[{"a":[true,false,null,-0,1.0E+2]}]]]}`,
	`{}`,
	// invalid or wrong-typed
	`{"id":"c"`,
	`{"id":"c",}`,
	`{"id":"c"} x`,
	`{"id":c}`,
	`{"id":"c\x"}`,
	`{"id":"c","choices":[{"index":"0"}]}`,
	`{"id":"c","choices":[{"index":1.5}]}`,
	`{"id":"c","choices":[{"index":0,"finish_reason":3}]}`,
	`{"id":"c","choices":{}}`,
	`{"id":"c","usage":{"completion_tokens":"3"}}`,
	`{"id":1}`,
	`{"a":01}`,
	`{"a":1.}`,
	`{"a":tru}`,
	`[1,2]`,
	``,
	"{\"id\":\"a\tb\"}",
}

// refKeys are the keys refChunk decodes.
var refKeys = []string{"id", "object", "choices", "index", "delta", "message", "text", "finish_reason",
	"usage", "error", "content", "reasoning_content", "prompt_tokens", "completion_tokens"}

// otherCaseKey reports whether data may hold one of refKeys in another case,
// which encoding/json matches (its keys are case-insensitive) and ReadChunk
// does not.
func otherCaseKey(data []byte) bool {
	lower := bytes.ToLower(data)
	for _, k := range refKeys {
		q := []byte(`"` + k + `"`)
		if bytes.Count(lower, q) != bytes.Count(data, q) {
			return true
		}
	}
	return false
}

// compareWithReference checks ReadChunk against encoding/json on data.
func compareWithReference(t *testing.T, data []byte) {
	t.Helper()
	var p Chunk
	err := ReadChunk(data, &p)
	if err == nil && !json.Valid(data) {
		t.Fatalf("ReadChunk accepted invalid JSON %q", data)
	}
	var ref refChunk
	refErr := json.Unmarshal(data, &ref)
	if err != nil {
		// encoding/json also accepts a top-level null and keys in another case
		if refErr == nil && !bytes.Equal(bytes.TrimSpace(data), []byte("null")) && !otherCaseKey(data) {
			t.Fatalf("ReadChunk rejected %q that encoding/json accepts", data)
		}
		return
	}
	if refErr != nil {
		if otherCaseKey(data) {
			return // encoding/json read a key in another case as one of ours
		}
		t.Fatalf("ReadChunk accepted %q, encoding/json: %v", data, refErr)
	}
	if otherCaseKey(data) || !utf8.Valid(data) {
		return // case-insensitive key matching or U+FFFD replacement: not comparable
	}
	if got, want := String(p.ID), deref(ref.ID); got != want {
		t.Errorf("%q: id %q, want %q", data, got, want)
	}
	if got, want := String(p.Object), deref(ref.Object); got != want {
		t.Errorf("%q: object %q, want %q", data, got, want)
	}
	if (p.Error != nil) != (ref.Error != nil) || (ref.Error != nil && (string(p.Error) == "null") != (string(ref.Error) == "null")) {
		t.Errorf("%q: error %q, want %q", data, p.Error, ref.Error)
	}
	if (p.Usage == nil) != (ref.Usage == nil) || (p.Usage != nil &&
		(p.Usage.PromptTokens != ref.Usage.PromptTokens || p.Usage.CompletionTokens != ref.Usage.CompletionTokens)) {
		t.Errorf("%q: usage %v, want %v", data, p.Usage, ref.Usage)
	}
	if len(p.Choices) != len(ref.Choices) {
		t.Fatalf("%q: %d choices, want %d", data, len(p.Choices), len(ref.Choices))
	}
	for i, c := range p.Choices {
		r := ref.Choices[i]
		if c.HasIndex != (r.Index != nil) || (r.Index != nil && c.Index != *r.Index) {
			t.Errorf("%q: choice %d index %v/%d, want %v", data, i, c.HasIndex, c.Index, r.Index)
		}
		if c.HasFinish != (r.FinishReason != nil) || String(c.Finish) != deref(r.FinishReason) {
			t.Errorf("%q: choice %d finish %v/%q, want %v", data, i, c.HasFinish, c.Finish, r.FinishReason)
		}
		if r.Delta != nil && r.Message != nil {
			continue // both keys: ReadChunk keeps the later one's content
		}
		m := r.Delta
		if m == nil {
			m = r.Message
		}
		if m == nil {
			m = &refMsg{}
		}
		want := deref(m.Content)
		if want == "" {
			want = deref(r.Text)
		}
		if want == "" {
			want = deref(m.ReasoningContent)
		}
		if got := String(c.Content); got != want {
			t.Errorf("%q: choice %d content %q, want %q", data, i, got, want)
		}
	}
}

func TestReadChunkMatchesEncodingJSON(t *testing.T) {
	for _, c := range chunkCases {
		compareWithReference(t, []byte(c))
	}
	// and the ones that must parse do
	for _, c := range chunkCases[:14] {
		var p Chunk
		if err := ReadChunk([]byte(c), &p); err != nil {
			t.Errorf("ReadChunk(%s): %v", c, err)
		}
	}
}

func TestReadChunkDepthLimit(t *testing.T) {
	deep := `{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`
	var p Chunk
	if err := ReadChunk([]byte(deep), &p); err == nil {
		t.Error("no error for 10001 levels of nesting")
	}
}

func TestReadChunkAllocs(t *testing.T) {
	data := []byte(chunkCases[1])
	var p Chunk
	_ = ReadChunk(data, &p)
	if n := testing.AllocsPerRun(100, func() { _ = ReadChunk(data, &p) }); n > 0 {
		t.Errorf("%v allocations per chunk, want 0", n)
	}
}

func FuzzReadChunk(f *testing.F) {
	for _, c := range chunkCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		compareWithReference(t, data)
	})
}
