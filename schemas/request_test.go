package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestReadRequest(t *testing.T) {
	chat := func(extra string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	type want struct {
		model, maxParam        string
		stream, usage, dflt    bool
		n, max, minTok, prio   int
		stop                   []string
		messages, prompts      int
		ignoreEOS, includeStop bool
	}
	for _, tc := range []struct {
		name  string
		kind  Kind
		body  string
		dflt  string
		want  want
		param string // the 400's param; "-" for a 400 without one; "" for success
	}{
		{"minimal chat", KindChat, chat(""), "", want{model: "m", n: 1, messages: 1}, ""},
		{"stream with options", KindChat, chat(`,"stream":true,"stream_options":{"include_usage":false},"n":3,"priority":-2`), "",
			want{model: "m", stream: true, n: 3, prio: -2, messages: 1}, ""},
		{"include_usage null means usage", KindChat, chat(`,"stream":true,"stream_options":{"include_usage":null}`), "",
			want{model: "m", stream: true, usage: true, n: 1, messages: 1}, ""},
		{"vLLM's empty stream_options means usage", KindChat, chat(`,"stream":true,"stream_options":{}`), "",
			want{model: "m", stream: true, usage: true, n: 1, messages: 1}, ""},
		{"include_usage matches exactly", KindChat, chat(`,"stream":true,"stream_options":{"include_usage":false,"Include_Usage":true}`), "",
			want{model: "m", stream: true, n: 1, messages: 1}, ""},
		{"nulls are absent", KindCompletion, `{"model":"m","prompt":"p","stream":null,"stream_options":null,"n":null,"priority":null,"max_tokens":null,"stop":null,"user":null}`, "",
			want{model: "m", n: 1, prompts: 1}, ""},
		{"escaped model", KindCompletion, `{"model":"a\/b\u00e9","prompt":[1]}`, "", want{model: "a/bé", n: 1, prompts: 1}, ""},
		{"escaped key", KindCompletion, `{"mod\u0065l":"m","prompt":"p"}`, "", want{model: "m", n: 1, prompts: 1}, ""},
		{"nested keys are not fields", KindChat, `{"x":{"model":"evil","stream":"no"},"messages":[{"role":"user","model":"e"}],"model":"m"}`, "",
			want{model: "m", n: 1, messages: 1}, ""},
		{"strings with braces", KindChat, `{"x":"}\"{[","messages":[{"role":"user","content":"]}\\"}],"model":"m"}`, "",
			want{model: "m", n: 1, messages: 1}, ""},
		{"default model", KindCompletion, `{"prompt":"p"}`, "pm", want{model: "pm", dflt: true, n: 1, prompts: 1}, ""},
		{"body model wins", KindCompletion, `{"prompt":"p","model":"bm"}`, "pm", want{model: "bm", n: 1, prompts: 1}, ""},
		{"max_completion_tokens wins for chat", KindChat, chat(`,"max_tokens":5,"max_completion_tokens":7,"min_tokens":7`), "",
			want{model: "m", n: 1, max: 7, maxParam: "max_completion_tokens", minTok: 7, messages: 1}, ""},
		{"max_completion_tokens is unknown to completions", KindCompletion, `{"model":"m","prompt":"p","max_completion_tokens":"x","max_tokens":4}`, "",
			want{model: "m", n: 1, max: 4, maxParam: "max_tokens", prompts: 1}, ""},
		{"messages are unknown to completions", KindCompletion, `{"model":"m","prompt":"p","messages":7}`, "", want{model: "m", n: 1, prompts: 1}, ""},
		{"stop string", KindCompletion, `{"model":"m","prompt":"p","stop":"\n"}`, "", want{model: "m", n: 1, stop: []string{"\n"}, prompts: 1}, ""},
		{"stop strings, eos flags", KindCompletion, `{"model":"m","prompt":"p","stop":["a","b"],"ignore_eos":true,"include_stop_str_in_output":true}`, "",
			want{model: "m", n: 1, stop: []string{"a", "b"}, ignoreEOS: true, includeStop: true, prompts: 1}, ""},
		{"prompt of strings", KindCompletion, `{"model":"m","prompt":["a","b","c"]}`, "", want{model: "m", n: 1, prompts: 3}, ""},
		{"prompt of token lists", KindCompletion, `{"model":"m","prompt":[[1,2],[3]]}`, "", want{model: "m", n: 1, prompts: 2}, ""},

		// The bodies of issue 11: a case variant is another key, a repeat is refused.
		{"Stream is not stream", KindChat, `{"model":"m","stream":false,"Stream":true,"messages":[{"role":"user","content":"hi"}]}`, "",
			want{model: "m", n: 1, messages: 1}, ""},
		{"Max_Tokens is not max_tokens", KindChat, chat(`,"max_tokens":5,"Max_Tokens":300`), "",
			want{model: "m", n: 1, max: 5, maxParam: "max_tokens", messages: 1}, ""},
		{"case-folded model is not model", KindChat, `{"Model":"m","messages":[{"role":"user"}]}`, "", want{}, "model"},
		{"duplicate max_tokens", KindChat, chat(`,"max_tokens":5,"max_tokens":300`), "", want{}, "max_tokens"},
		{"duplicate model", KindChat, `{"model":"a","messages":[{"role":"user"}],"model":"b"}`, "", want{}, "model"},
		{"duplicate via escape", KindChat, `{"model":"a","messages":[{"role":"user"}],"mod\u0065l":"b"}`, "", want{}, "model"},
		{"duplicate stream", KindChat, chat(`,"stream":false,"stream":true`), "", want{}, "stream"},
		{"duplicate include_usage", KindChat, chat(`,"stream":true,"stream_options":{"include_usage":true,"include_usage":false}`), "", want{}, "stream_options.include_usage"},
		{"duplicate role", KindChat, `{"model":"m","messages":[{"role":"user","role":"system"}]}`, "", want{}, "messages[0].role"},
		{"duplicate content", KindChat, `{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`, "", want{}, "messages[0].content"},
		{"duplicate part text", KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`, "", want{}, "messages[0].content[0].text"},

		{"type errors come before missing or empty", KindChat, `{"model":"m","stream":"yes","messages":[]}`, "", want{}, "stream"},
		{"n as a decimal", KindChat, chat(`,"n":1.5`), "", want{}, "n"},
		{"n out of range", KindChat, chat(`,"n":99999999999999999999`), "", want{}, "n"},
		{"n zero", KindChat, chat(`,"n":0`), "", want{}, "n"},
		{"max_tokens zero", KindCompletion, `{"model":"m","prompt":"p","max_tokens":0}`, "", want{}, "max_tokens"},
		{"max_completion_tokens negative", KindChat, chat(`,"max_completion_tokens":-1`), "", want{}, "max_completion_tokens"},
		{"min_tokens over max", KindCompletion, `{"model":"m","prompt":"p","max_tokens":2,"min_tokens":3}`, "", want{}, "min_tokens"},
		{"min_tokens negative", KindCompletion, `{"model":"m","prompt":"p","min_tokens":-1}`, "", want{}, "min_tokens"},
		{"include_usage type", KindChat, chat(`,"stream":true,"stream_options":{"include_usage":"yes"}`), "", want{}, "stream_options.include_usage"},
		{"stream_options not an object", KindChat, chat(`,"stream":true,"stream_options":true`), "", want{}, "stream_options"},
		{"stream_options without stream", KindChat, chat(`,"stream_options":{"include_usage":true}`), "", want{}, "stream_options"},
		{"empty model", KindChat, `{"model":"","messages":[{"role":"user"}]}`, "pm", want{}, "model"},
		{"no model", KindChat, `{"messages":[{"role":"user"}]}`, "", want{}, "model"},
		{"null model, even with a default", KindChat, `{"model":null,"messages":[{"role":"user"}]}`, "pm", want{}, "model"},
		{"model not a string", KindChat, `{"model":1,"messages":[{"role":"user"}]}`, "", want{}, "model"},
		{"prompt number", KindCompletion, `{"model":"m","prompt":5}`, "", want{}, "prompt"},
		{"prompt empty array", KindCompletion, `{"model":"m","prompt":[ ]}`, "", want{}, "prompt"},
		{"prompt mixed", KindCompletion, `{"model":"m","prompt":["a",1]}`, "", want{}, "prompt"},
		{"prompt token not an integer", KindCompletion, `{"model":"m","prompt":[1,2.5]}`, "", want{}, "prompt"},
		{"prompt missing", KindCompletion, `{"model":"m"}`, "", want{}, "prompt"},
		{"messages missing", KindChat, `{"model":"m"}`, "", want{}, "messages"},
		{"messages null", KindChat, `{"model":"m","messages":null}`, "", want{}, "messages"},
		{"messages empty", KindChat, `{"model":"m","messages":[]}`, "", want{}, "messages"},
		{"messages not an array", KindChat, `{"model":"m","messages":"hi"}`, "", want{}, "messages"},
		{"message not an object", KindChat, `{"model":"m","messages":[{"role":"user"},3]}`, "", want{}, "messages[1]"},
		{"message without role", KindChat, `{"model":"m","messages":[{"content":"hi"}]}`, "", want{}, "messages[0].role"},
		{"message with empty role", KindChat, `{"model":"m","messages":[{"role":""}]}`, "", want{}, "messages[0].role"},
		{"content a number", KindChat, `{"model":"m","messages":[{"role":"user","content":5}]}`, "", want{}, "messages[0].content"},
		{"part text a number", KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, "", want{}, "messages[0].content[0].text"},
		{"part not an object", KindChat, `{"model":"m","messages":[{"role":"user","content":["x"]}]}`, "", want{}, "messages[0].content[0]"},
		{"stop a number", KindCompletion, `{"model":"m","prompt":"hi","stop":5}`, "", want{}, "stop"},
		{"stop with a number", KindCompletion, `{"model":"m","prompt":"hi","stop":["a",5]}`, "", want{}, "stop"},
		{"empty stop string", KindCompletion, `{"model":"m","prompt":"hi","stop":[""]}`, "", want{}, "stop"},
		{"seed a string", KindCompletion, `{"model":"m","prompt":"hi","seed":"s"}`, "", want{}, "seed"},
		{"trailing garbage", KindChat, chat("") + ` x`, "", want{}, "-"},
		{"truncated", KindChat, `{"model":"m","messages":[{}`, "", want{}, "-"},
		{"malformed after a type error", KindChat, `{"model":1,"messages":[}`, "", want{}, "-"},
		{"array body", KindChat, `[{"model":"m"}]`, "", want{}, "-"},
		{"empty body", KindChat, ` `, "", want{}, "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ReadRequest(tc.kind, []byte(tc.body), tc.dflt)
			if tc.param != "" {
				if err == nil {
					t.Fatalf("accepted: %+v", r)
				}
				param := "-"
				if err.Body.Param != nil {
					param = *err.Body.Param
				}
				if err.Status != 400 || param != tc.param || err.Body.Type != TypeInvalidRequest {
					t.Fatalf("got %d param %q (%s), want 400 param %q", err.Status, param, err.Body.Message, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			got := want{model: r.Model, maxParam: r.MaxTokensParam, stream: r.Stream, usage: r.IncludeUsage, dflt: r.ModelDefaulted,
				n: r.N, max: r.MaxTokens, minTok: r.MinTokens, prio: r.Priority, stop: r.Stop, messages: len(r.Messages),
				prompts: r.Prompt.Len(), ignoreEOS: r.IgnoreEOS, includeStop: r.IncludeStopStr}
			if tc.kind == KindChat {
				got.prompts = 0
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMessageTextAndPrompts(t *testing.T) {
	r, err := ReadRequest(KindChat, []byte(`{"model":"m","messages":[
		{"role":"system","content":"be \"brief\"\n\u00e9\ud83d\ude00"},
		{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"text":"b"}]},
		{"role":"assistant","content":null,"tool_calls":[]},
		{"role":"r\u00f4le"}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range r.Messages {
		got = append(got, m.Role+"="+m.Text())
	}
	want := []string{"system=be \"brief\"\né😀", "user=a\nb", "assistant=", "rôle="}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("messages %q, want %q", got, want)
	}

	for body, want := range map[string]string{
		`"once"`:            `text [once]`,
		`["a","b\u0041"]`:   `text [a bA]`,
		`[1,2,-3]`:          `ids [[1 2 -3]]`,
		`[[1],[],[2,3]]`:    `ids [[1] [] [2 3]]`,
		`[ [ 7 ] , [ 8 ] ]`: `ids [[7] [8]]`,
	} {
		r, err := ReadRequest(KindCompletion, []byte(`{"model":"m","prompt":`+body+`}`), "")
		if err != nil {
			t.Fatal(err)
		}
		var got string
		if r.Prompt.IsText() {
			got = fmt.Sprint("text ", r.Prompt.Texts())
		} else {
			got = fmt.Sprint("ids ", r.Prompt.TokenIDs())
		}
		if got != want {
			t.Errorf("prompt %s: %s, want %s", body, got, want)
		}
	}
}

// The scanner agrees with encoding/json on what is JSON, nesting limit included.
func TestValidJSONDepth(t *testing.T) {
	for _, depth := range []int{maxJSONDepth - 1, maxJSONDepth, maxJSONDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			b := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(close, depth))
			if got, want := validJSON(b), json.Valid(b); got != want {
				t.Errorf("depth %d of %s: valid %v, encoding/json %v", depth, open, got, want)
			}
			body := []byte(`{"model":"m","prompt":"p","x":` + string(b[2:len(b)-1]) + `}`)
			_, err := ReadRequest(KindCompletion, body, "")
			if (err == nil) != json.Valid(body) {
				t.Errorf("depth %d of %s in a request: err %v, encoding/json valid %v", depth, open, err, json.Valid(body))
			}
		}
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[1,"a",{"b":null}]`, `"\ud800"`, "\"\x01\"", `1e5`, `-0.0`, `01`, `[1,]`, `{"a" 1}`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, encoding/json says %v", b, got, want)
		}
		b = bytes.TrimSpace(b)
		if !json.Valid(b) || len(b) == 0 || b[0] != '"' {
			return
		}
		var want string
		if json.Unmarshal(b, &want) == nil {
			if got := jsonString(b[1 : len(b)-1]); got != want {
				t.Fatalf("jsonString(%q) = %q, encoding/json says %q", b, got, want)
			}
		}
	})
}

// FuzzReadRequest: ReadRequest never panics, accepts exactly the bodies an
// exact-key reading with encoding/json accepts (the reference below), and
// reads the same values from them.
func FuzzReadRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"x"}]}],"stream":true,"stream_options":{}}`,
		`{"Model":"x","model":"m","messages":[1]}`, `{"a":{"model":1},"model":"m","messages":[{"role":"}"}]}`,
		`{"mod\u0065l":"m","messages":[{"role":"r"}]}`, `{"model":"m","messages":[{"role":"r"}],"n":2,"priority":1,"max_tokens":3,"min_tokens":1}`,
		`{"model":"m","prompt":[[1,2],[3]],"stop":["x"],"seed":-4,"ignore_eos":true,"user":"u"}`,
		`{"model":"m","prompt":"p","max_tokens":5,"Max_Tokens":300}`, `{}`, `[]`, `"x"`,
		`{"model":"m","messages":[{"role":"user"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"strict":true}}}`,
		`{"model":"m","messages":[{"role":"user"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{},"strict":null}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false}`,
		`{"model":"m","messages":[{"role":"user"}],"tool_choice":"auto","logprobs":true,"top_logprobs":3,"reasoning_effort":"low"}`,
		`{"model":"m","prompt":"p","logprobs":2,"response_format":{"type":"json_object","json_schema":null}}`,
		`{"model":"m","messages":[{"role":"user"}],"tools":[{"function":{"name":"a","name":"b"}}]}`,
	} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, completion bool) {
		kind := KindChat
		if completion {
			kind = KindCompletion
		}
		got, gerr := ReadRequest(kind, []byte(body), "")
		want, werr := referenceRead(kind, []byte(body))
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%s: ReadRequest error %v, reference error %v", body, gerr, werr)
		}
		if gerr != nil {
			if gerr.Status != 400 {
				t.Fatalf("%s: status %d", body, gerr.Status)
			}
			return
		}
		g := viewOf(got)
		if !reflect.DeepEqual(g, want) {
			t.Fatalf("%s:\n got  %+v\n want %+v", body, g, want)
		}
	})
}

// view is what the fuzz test compares: every value of a Request.
type view struct {
	Model                       string
	Stream, Usage, StreamOpts   bool
	Max                         int
	MaxParam                    string
	Min, N, Seed, Prio          int
	HasSeed, IgnoreEOS, InclStr bool
	Stop                        []string
	User                        string
	Roles, Texts                []string
	PromptTexts                 []string
	PromptIDs                   [][]int

	Format             ResponseFormat
	Tools              []Tool
	Choice             ToolChoice
	Parallel, Logprobs bool
	TopLogprobs        int
	Effort             string
}

func viewOf(r *Request) view {
	v := view{Model: r.Model, Stream: r.Stream, Usage: r.IncludeUsage, StreamOpts: r.StreamOptions, Max: r.MaxTokens,
		MaxParam: r.MaxTokensParam, Min: r.MinTokens, N: r.N, Seed: r.Seed, Prio: r.Priority, HasSeed: r.HasSeed,
		IgnoreEOS: r.IgnoreEOS, InclStr: r.IncludeStopStr, Stop: r.Stop, User: r.User}
	for _, m := range r.Messages {
		v.Roles = append(v.Roles, m.Role)
		v.Texts = append(v.Texts, m.Text())
	}
	v.PromptTexts, v.PromptIDs = r.Prompt.Texts(), r.Prompt.TokenIDs()
	v.Format, v.Tools, v.Choice, v.Parallel, v.Logprobs, v.TopLogprobs, v.Effort =
		r.ResponseFormat, r.Tools, r.ToolChoice, r.ParallelToolCalls, r.Logprobs, r.TopLogprobs, r.ReasoningEffort
	// Raw schemas compare by value: the reference has no raw text.
	v.Format.Schema = canonical(v.Format.Schema)
	v.Tools = nil
	for _, t := range r.Tools {
		t.Parameters = canonical(t.Parameters)
		v.Tools = append(v.Tools, t)
	}
	return v
}

// canonical is raw JSON re-encoded from its node (nil stays nil).
func canonical(raw []byte) []byte {
	if raw == nil {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	n, err := decodeNode(d)
	if err != nil {
		return []byte("bad: " + err.Error())
	}
	return n.encode(nil)
}

// encode writes n as JSON, members in order.
func (n node) encode(dst []byte) []byte {
	switch n.kind {
	case '{':
		dst = append(dst, '{')
		for i, m := range n.members {
			if i > 0 {
				dst = append(dst, ',')
			}
			k, _ := json.Marshal(m.key)
			dst = append(append(dst, k...), ':')
			dst = m.val.encode(dst)
		}
		return append(dst, '}')
	case '[':
		dst = append(dst, '[')
		for i, e := range n.elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = e.encode(dst)
		}
		return append(dst, ']')
	case '"':
		s, _ := json.Marshal(n.str)
		return append(dst, s...)
	case 'n':
		return append(dst, n.num...)
	case 'b':
		if n.b {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	}
	return append(dst, "null"...)
}

// node is a JSON value with its object members in order and keys exact: the
// reference reader's input, built with encoding/json's tokenizer.
type node struct {
	kind    byte // '{', '[', '"', 'n' (number), 'b', '0' (null)
	members []member
	elems   []node
	str     string
	num     json.Number
	b       bool
}

type member struct {
	key string
	val node
}

func decodeNode(d *json.Decoder) (node, error) {
	tok, err := d.Token()
	if err != nil {
		return node{}, err
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			n := node{kind: '{'}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return node{}, err
				}
				val, err := decodeNode(d)
				if err != nil {
					return node{}, err
				}
				n.members = append(n.members, member{k.(string), val})
			}
			_, err := d.Token()
			return n, err
		}
		n := node{kind: '['}
		for d.More() {
			e, err := decodeNode(d)
			if err != nil {
				return node{}, err
			}
			n.elems = append(n.elems, e)
		}
		_, err := d.Token()
		return n, err
	case string:
		return node{kind: '"', str: v}, nil
	case json.Number:
		return node{kind: 'n', num: v}, nil
	case bool:
		return node{kind: 'b', b: v}, nil
	}
	return node{kind: '0'}, nil
}

var errRef = fmt.Errorf("rejected")

// get returns the members of n named key, exactly.
func (n node) get(key string) []node {
	var out []node
	for _, m := range n.members {
		if m.key == key {
			out = append(out, m.val)
		}
	}
	return out
}

func (n node) integer() (int, bool) {
	var i int
	if n.kind != 'n' || json.Unmarshal([]byte(n.num), &i) != nil {
		return 0, false
	}
	return i, true
}

// referenceRead is ReadRequest written the slow, obvious way on top of
// encoding/json, for the fuzz test.
func referenceRead(kind Kind, body []byte) (view, error) {
	if !json.Valid(body) {
		return view{}, errRef
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	root, err := decodeNode(d)
	if err != nil || root.kind != '{' {
		return view{}, errRef
	}
	if _, err := d.Token(); err != io.EOF {
		return view{}, errRef
	}
	known := []string{"model", "stream", "stream_options", "max_tokens", "min_tokens", "n", "seed", "stop",
		"ignore_eos", "include_stop_str_in_output", "priority", "user", "response_format", "logprobs"}
	if kind == KindChat {
		known = append(known, "messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
			"top_logprobs", "reasoning_effort")
	} else {
		known = append(known, "prompt")
	}
	field := map[string]*node{}
	for _, k := range known {
		vs := root.get(k)
		if len(vs) > 1 {
			return view{}, errRef
		}
		if len(vs) == 1 && vs[0].kind != '0' {
			field[k] = &vs[0]
		}
	}
	v := view{N: 1, Parallel: true}
	str := func(k string, dst *string) bool {
		n := field[k]
		if n == nil {
			return true
		}
		*dst = n.str
		return n.kind == '"'
	}
	boolean := func(k string, dst *bool) bool {
		n := field[k]
		if n == nil {
			return true
		}
		*dst = n.b
		return n.kind == 'b'
	}
	integer := func(k string, dst *int) bool {
		n := field[k]
		if n == nil {
			return true
		}
		i, ok := n.integer()
		*dst = i
		return ok
	}
	var maxT, maxC int
	if !str("model", &v.Model) || !boolean("stream", &v.Stream) || !integer("max_tokens", &maxT) ||
		!integer("max_completion_tokens", &maxC) || !integer("min_tokens", &v.Min) || !integer("n", &v.N) ||
		!integer("seed", &v.Seed) || !boolean("ignore_eos", &v.IgnoreEOS) ||
		!boolean("include_stop_str_in_output", &v.InclStr) || !integer("priority", &v.Prio) || !str("user", &v.User) {
		return view{}, errRef
	}
	v.HasSeed = field["seed"] != nil
	if !refFormatAndTools(kind, field, &v) {
		return view{}, errRef
	}
	if so := field["stream_options"]; so != nil {
		if so.kind != '{' {
			return view{}, errRef
		}
		v.StreamOpts, v.Usage = true, true
		inc := so.get("include_usage")
		if len(inc) > 1 || len(inc) == 1 && inc[0].kind != 'b' && inc[0].kind != '0' {
			return view{}, errRef
		}
		if len(inc) == 1 && inc[0].kind == 'b' {
			v.Usage = inc[0].b
		}
	}
	if st := field["stop"]; st != nil {
		switch st.kind {
		case '"':
			v.Stop = []string{st.str}
		case '[':
			v.Stop = []string{}
			for _, e := range st.elems {
				if e.kind != '"' {
					return view{}, errRef
				}
				v.Stop = append(v.Stop, e.str)
			}
			if len(v.Stop) == 0 {
				v.Stop = nil
			}
		default:
			return view{}, errRef
		}
	}
	if kind == KindChat {
		ms := field["messages"]
		if ms == nil || ms.kind != '[' || len(ms.elems) == 0 {
			return view{}, errRef
		}
		for _, m := range ms.elems {
			if m.kind != '{' {
				return view{}, errRef
			}
			roles, contents := m.get("role"), m.get("content")
			if len(roles) != 1 || roles[0].kind != '"' || roles[0].str == "" || len(contents) > 1 {
				return view{}, errRef
			}
			text := ""
			if len(contents) == 1 {
				switch c := contents[0]; c.kind {
				case '"':
					text = c.str
				case '0':
				case '[':
					var parts []string
					for _, p := range c.elems {
						if p.kind != '{' {
							return view{}, errRef
						}
						typ, txt := p.get("type"), p.get("text")
						if len(typ) > 1 || len(txt) > 1 || len(typ) == 1 && typ[0].kind != '"' || len(txt) == 1 && txt[0].kind != '"' {
							return view{}, errRef
						}
						if len(txt) == 1 && (len(typ) == 0 || typ[0].str == "text") {
							parts = append(parts, txt[0].str)
						}
					}
					text = strings.Join(parts, "\n")
				default:
					return view{}, errRef
				}
			}
			v.Roles = append(v.Roles, roles[0].str)
			v.Texts = append(v.Texts, text)
		}
	} else {
		p := field["prompt"]
		if p == nil {
			return view{}, errRef
		}
		switch p.kind {
		case '"':
			v.PromptTexts = []string{p.str}
		case '[':
			if len(p.elems) == 0 {
				return view{}, errRef
			}
			ids := func(n node) ([]int, bool) {
				var out []int
				for _, e := range n.elems {
					i, ok := e.integer()
					if !ok {
						return nil, false
					}
					out = append(out, i)
				}
				return out, true
			}
			switch p.elems[0].kind {
			case '"':
				for _, e := range p.elems {
					if e.kind != '"' {
						return view{}, errRef
					}
					v.PromptTexts = append(v.PromptTexts, e.str)
				}
			case '[':
				for _, e := range p.elems {
					if e.kind != '[' {
						return view{}, errRef
					}
					l, ok := ids(e)
					if !ok {
						return view{}, errRef
					}
					v.PromptIDs = append(v.PromptIDs, l)
				}
			default:
				l, ok := ids(*p)
				if !ok {
					return view{}, errRef
				}
				v.PromptIDs = [][]int{l}
			}
		default:
			return view{}, errRef
		}
	}
	// Values.
	switch {
	case v.Model == "", v.StreamOpts && !v.Stream, v.N < 1,
		field["max_tokens"] != nil && maxT < 1, field["max_completion_tokens"] != nil && maxC < 1:
		return view{}, errRef
	}
	for _, s := range v.Stop {
		if s == "" {
			return view{}, errRef
		}
	}
	if !v.Stream {
		v.Usage = false
	}
	if field["max_completion_tokens"] != nil {
		v.Max, v.MaxParam = maxC, "max_completion_tokens"
	} else if field["max_tokens"] != nil {
		v.Max, v.MaxParam = maxT, "max_tokens"
	}
	if field["min_tokens"] != nil && (v.Min < 0 || v.Max > 0 && v.Min > v.Max) {
		return view{}, errRef
	}
	return v, nil
}

// refFormatAndTools reads response_format, tools, tool_choice,
// parallel_tool_calls, logprobs, top_logprobs and reasoning_effort for the
// reference reader: types checked, repeated members refused.
func refFormatAndTools(kind Kind, field map[string]*node, v *view) bool {
	// one returns the member named key of n: absent or null is nil; ok is
	// false when it is repeated.
	one := func(n node, key string) (*node, bool) {
		vs := n.get(key)
		if len(vs) > 1 {
			return nil, false
		}
		if len(vs) == 0 || vs[0].kind == '0' {
			return nil, true
		}
		return &vs[0], true
	}
	str := func(n node, key string, dst *string) bool {
		m, ok := one(n, key)
		if !ok || m == nil {
			return ok
		}
		*dst = m.str
		return m.kind == '"'
	}
	boolean := func(n node, key string, dst *bool) bool {
		m, ok := one(n, key)
		if !ok || m == nil {
			return ok
		}
		*dst = m.b
		return m.kind == 'b'
	}
	object := func(n node, key string, dst *[]byte) bool {
		m, ok := one(n, key)
		if !ok || m == nil {
			return ok
		}
		*dst = m.encode(nil)
		return m.kind == '{'
	}
	if rf := field["response_format"]; rf != nil {
		if rf.kind != '{' || !str(*rf, "type", &v.Format.Type) {
			return false
		}
		js, ok := one(*rf, "json_schema")
		if !ok {
			return false
		}
		if js != nil {
			if js.kind != '{' {
				return false
			}
			v.Format.HasJSONSchema = true
			if !str(*js, "name", &v.Format.Name) || !object(*js, "schema", &v.Format.Schema) || !boolean(*js, "strict", &v.Format.Strict) {
				return false
			}
		}
	}
	if lp := field["logprobs"]; lp != nil {
		if kind == KindCompletion {
			i, ok := lp.integer()
			if !ok {
				return false
			}
			v.Logprobs, v.TopLogprobs = true, i
		} else {
			if lp.kind != 'b' {
				return false
			}
			v.Logprobs = lp.b
		}
	}
	if kind != KindChat {
		return true
	}
	if tl := field["top_logprobs"]; tl != nil {
		i, ok := tl.integer()
		if !ok {
			return false
		}
		v.TopLogprobs = i
	}
	if p := field["parallel_tool_calls"]; p != nil {
		if p.kind != 'b' {
			return false
		}
		v.Parallel = p.b
	}
	if re := field["reasoning_effort"]; re != nil {
		if re.kind != '"' {
			return false
		}
		v.Effort = re.str
	}
	if ts := field["tools"]; ts != nil {
		if ts.kind != '[' {
			return false
		}
		v.Tools = nil
		for _, e := range ts.elems {
			if e.kind != '{' {
				return false
			}
			var t Tool
			if !str(e, "type", &t.Type) {
				return false
			}
			fn, ok := one(e, "function")
			if !ok {
				return false
			}
			if fn != nil {
				if fn.kind != '{' {
					return false
				}
				t.HasFunction = true
				if !str(*fn, "name", &t.Name) || !str(*fn, "description", &t.Description) ||
					!object(*fn, "parameters", &t.Parameters) || !boolean(*fn, "strict", &t.Strict) {
					return false
				}
			}
			v.Tools = append(v.Tools, t)
		}
	}
	if tc := field["tool_choice"]; tc != nil {
		switch tc.kind {
		case '"':
			v.Choice.Mode = tc.str
		case '{':
			if !str(*tc, "type", &v.Choice.Mode) {
				return false
			}
			fn, ok := one(*tc, "function")
			if !ok {
				return false
			}
			if fn != nil && (fn.kind != '{' || !str(*fn, "name", &v.Choice.Name)) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// BenchmarkReadRequest: the gateway's cost of reading a chat body of about
// 64 KiB (128 messages), the same body as the old gateway benchmark.
func BenchmarkReadRequest(b *testing.B) {
	body := []byte(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"messages":[` +
		strings.Repeat(`{"role":"user","content":"`+strings.Repeat("lorem ipsum ", 40)+`"},`, 128) +
		`{"role":"user","content":"hi"}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r, err := ReadRequest(KindChat, body, "")
		if err != nil || !r.Stream {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadRequestSmall: a typical short chat request.
func BenchmarkReadRequestSmall(b *testing.B) {
	body := []byte(`{"model":"llama-8b","stream":true,"max_tokens":64,"temperature":0.7,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Tell me a story about a dragon who learns to code."}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := ReadRequest(KindChat, body, ""); err != nil {
			b.Fatal(err)
		}
	}
}
