package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tokenbus/tokenbus/internal/jsonscan"
)

// refChunk decodes a chunk with encoding/json, the reference for parseChunk.
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
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
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
// which encoding/json matches (its keys are case-insensitive) and parseChunk
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

// compareWithReference checks parseChunk against encoding/json on data.
func compareWithReference(t *testing.T, data []byte) {
	t.Helper()
	var p parsedChunk
	err := parseChunk(data, &p)
	if err == nil && !json.Valid(data) {
		t.Fatalf("parseChunk accepted invalid JSON %q", data)
	}
	var ref refChunk
	refErr := json.Unmarshal(data, &ref)
	if err != nil {
		// encoding/json also accepts a top-level null and keys in another case
		if refErr == nil && !bytes.Equal(bytes.TrimSpace(data), []byte("null")) && !otherCaseKey(data) {
			t.Fatalf("parseChunk rejected %q that encoding/json accepts", data)
		}
		return
	}
	if refErr != nil {
		t.Fatalf("parseChunk accepted %q, encoding/json: %v", data, refErr)
	}
	if otherCaseKey(data) || !utf8.Valid(data) {
		return // case-insensitive key matching or U+FFFD replacement: not comparable
	}
	if got, want := string(jsonscan.Key(p.id)), deref(ref.ID); got != want {
		t.Errorf("%q: id %q, want %q", data, got, want)
	}
	if got, want := string(jsonscan.Key(p.object)), deref(ref.Object); got != want {
		t.Errorf("%q: object %q, want %q", data, got, want)
	}
	if (p.errRaw != nil) != (ref.Error != nil) || (ref.Error != nil && (string(p.errRaw) == "null") != (string(ref.Error) == "null")) {
		t.Errorf("%q: error %q, want %q", data, p.errRaw, ref.Error)
	}
	if (p.usage == nil) != (ref.Usage == nil) || (p.usage != nil && *p.usage != *ref.Usage) {
		t.Errorf("%q: usage %v, want %v", data, p.usage, ref.Usage)
	}
	if len(p.choices) != len(ref.Choices) {
		t.Fatalf("%q: %d choices, want %d", data, len(p.choices), len(ref.Choices))
	}
	for i, c := range p.choices {
		r := ref.Choices[i]
		if c.hasIndex != (r.Index != nil) || (r.Index != nil && c.index != *r.Index) {
			t.Errorf("%q: choice %d index %v/%d, want %v", data, i, c.hasIndex, c.index, r.Index)
		}
		if c.hasFin != (r.FinishReason != nil) || string(jsonscan.Key(c.finish)) != deref(r.FinishReason) {
			t.Errorf("%q: choice %d finish %v/%q, want %v", data, i, c.hasFin, c.finish, r.FinishReason)
		}
		if r.Delta != nil && r.Message != nil {
			continue // both keys: parseChunk keeps the later one's content
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
		if got := string(jsonscan.Key(c.content)); got != want {
			t.Errorf("%q: choice %d content %q, want %q", data, i, got, want)
		}
	}
}

func TestParseChunkMatchesEncodingJSON(t *testing.T) {
	for _, c := range chunkCases {
		compareWithReference(t, []byte(c))
	}
	// and the ones that must parse do
	for _, c := range chunkCases[:14] {
		var p parsedChunk
		if err := parseChunk([]byte(c), &p); err != nil {
			t.Errorf("parseChunk(%s): %v", c, err)
		}
	}
}

func TestParseChunkDepthLimit(t *testing.T) {
	deep := `{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`
	var p parsedChunk
	if err := parseChunk([]byte(deep), &p); err == nil {
		t.Error("no error for 10000 levels of nesting")
	}
}

func TestParseChunkAllocs(t *testing.T) {
	data := []byte(chunkCases[1])
	var p parsedChunk
	_ = parseChunk(data, &p)
	if n := testing.AllocsPerRun(100, func() { _ = parseChunk(data, &p) }); n > 0 {
		t.Errorf("%v allocations per chunk, want 0", n)
	}
}

func FuzzParseChunk(f *testing.F) {
	for _, c := range chunkCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		compareWithReference(t, data)
	})
}
