package schemas

import (
	"reflect"
	"testing"
)

// The kinds that do not generate: embeddings, tokenize, detokenize.
func TestReadRequestNonGenerating(t *testing.T) {
	type want struct {
		model      string
		texts      []string
		ids        [][]int
		format     string
		dims       int
		user       string
		addGen     bool
		cont       bool
		strs       bool
		messages   int
		tokens     []int
		prompt     string
		generates  bool
		inputCount int
	}
	for _, tc := range []struct {
		name  string
		kind  Kind
		body  string
		want  want
		code  string // the 400's code; "" for success
		param string
	}{
		{"embedding string", KindEmbedding, `{"model":"e","input":"hello world"}`,
			want{model: "e", texts: []string{"hello world"}, format: "float", inputCount: 1}, "", ""},
		{"embedding strings, base64, dims, user", KindEmbedding,
			`{"model":"e","input":["a","b"],"encoding_format":"base64","dimensions":8,"user":"u"}`,
			want{model: "e", texts: []string{"a", "b"}, format: "base64", dims: 8, user: "u", inputCount: 2}, "", ""},
		{"embedding token ids", KindEmbedding, `{"model":"e","input":[1,2,3]}`,
			want{model: "e", ids: [][]int{{1, 2, 3}}, format: "float", inputCount: 1}, "", ""},
		{"embedding lists of token ids", KindEmbedding, `{"model":"e","input":[[1],[2,3]],"encoding_format":null}`,
			want{model: "e", ids: [][]int{{1}, {2, 3}}, format: "float", inputCount: 2}, "", ""},
		{"embedding ignores generation fields", KindEmbedding, `{"model":"e","input":"x","stream":"yes","n":0,"prompt":7,"max_tokens":-1}`,
			want{model: "e", texts: []string{"x"}, format: "float", inputCount: 1}, "", ""},
		{"embedding without input", KindEmbedding, `{"model":"e"}`, want{}, "missing_required_parameter", "input"},
		{"embedding null input", KindEmbedding, `{"model":"e","input":null}`, want{}, "missing_required_parameter", "input"},
		{"embedding without model", KindEmbedding, `{"input":"x"}`, want{}, "missing_required_parameter", "model"},
		{"embedding empty input array", KindEmbedding, `{"model":"e","input":[]}`, want{}, "empty_array", "input"},
		{"embedding empty string", KindEmbedding, `{"model":"e","input":""}`, want{}, "invalid_value", "input"},
		{"embedding empty string in a list", KindEmbedding, `{"model":"e","input":["a",""]}`, want{}, "invalid_value", "input[1]"},
		{"embedding empty token list", KindEmbedding, `{"model":"e","input":[[1],[]]}`, want{}, "empty_array", "input[1]"},
		{"embedding input number", KindEmbedding, `{"model":"e","input":5}`, want{}, "invalid_type", "input"},
		{"embedding mixed input", KindEmbedding, `{"model":"e","input":["a",1]}`, want{}, "invalid_type", "input"},
		{"embedding float token", KindEmbedding, `{"model":"e","input":[1.5]}`, want{}, "invalid_type", "input"},
		{"embedding object input", KindEmbedding, `{"model":"e","input":{"text":"a"}}`, want{}, "invalid_type", "input"},
		{"embedding bad encoding_format", KindEmbedding, `{"model":"e","input":"a","encoding_format":"int8"}`, want{}, "invalid_value", "encoding_format"},
		{"embedding empty encoding_format", KindEmbedding, `{"model":"e","input":"a","encoding_format":""}`, want{}, "invalid_value", "encoding_format"},
		{"embedding encoding_format type", KindEmbedding, `{"model":"e","input":"a","encoding_format":1}`, want{}, "invalid_type", "encoding_format"},
		{"embedding dimensions 0", KindEmbedding, `{"model":"e","input":"a","dimensions":0}`, want{}, "integer_below_min_value", "dimensions"},
		{"embedding dimensions string", KindEmbedding, `{"model":"e","input":"a","dimensions":"8"}`, want{}, "invalid_type", "dimensions"},
		{"embedding dimensions decimal", KindEmbedding, `{"model":"e","input":"a","dimensions":8.5}`, want{}, "invalid_type", "dimensions"},
		{"embedding chat form", KindEmbedding, `{"model":"e","messages":[{"role":"user","content":"hi"}],"dimensions":4}`,
			want{model: "e", format: "float", dims: 4, messages: 1}, "", ""},
		{"embedding chat form, generation prompt", KindEmbedding, `{"model":"e","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}`,
			want{model: "e", format: "float", messages: 1, addGen: true}, "", ""},
		{"embedding input and messages", KindEmbedding, `{"model":"e","input":"a","messages":[{"role":"user"}]}`, want{}, "invalid_value", "messages"},
		{"embedding empty messages", KindEmbedding, `{"model":"e","messages":[]}`, want{}, "empty_array", "messages"},
		{"embedding null messages", KindEmbedding, `{"model":"e","messages":null}`, want{}, "missing_required_parameter", "input"},
		{"embedding continue and generation prompt", KindEmbedding, `{"model":"e","messages":[{"role":"user"}],"continue_final_message":true,"add_generation_prompt":true}`,
			want{}, "invalid_value", "continue_final_message"},
		{"embedding repeated input", KindEmbedding, `{"model":"e","input":"a","input":"b"}`, want{}, "duplicate_parameter", "input"},

		{"tokenize prompt", KindTokenize, `{"model":"m","prompt":"hi","return_token_strs":true}`,
			want{model: "m", prompt: "hi", strs: true, addGen: true, format: "float"}, "", ""},
		{"tokenize messages", KindTokenize, `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
			want{model: "m", messages: 1, format: "float"}, "", ""},
		{"tokenize continue", KindTokenize, `{"model":"m","messages":[{"role":"assistant","content":"hi"}],"add_generation_prompt":false,"continue_final_message":true}`,
			want{model: "m", messages: 1, cont: true, format: "float"}, "", ""},
		{"tokenize continue and generation prompt", KindTokenize, `{"model":"m","messages":[{"role":"assistant","content":"hi"}],"continue_final_message":true}`,
			want{}, "invalid_value", "continue_final_message"},
		{"tokenize neither", KindTokenize, `{"model":"m"}`, want{}, "missing_required_parameter", "prompt"},
		{"tokenize both", KindTokenize, `{"model":"m","prompt":"a","messages":[{"role":"user"}]}`, want{}, "invalid_value", "messages"},
		{"tokenize prompt list", KindTokenize, `{"model":"m","prompt":["a"]}`, want{}, "invalid_type", "prompt"},
		{"tokenize empty messages", KindTokenize, `{"model":"m","messages":[]}`, want{}, "empty_array", "messages"},
		{"tokenize message without role", KindTokenize, `{"model":"m","messages":[{"content":"x"}]}`, want{}, "missing_required_parameter", "messages[0].role"},
		{"tokenize without model", KindTokenize, `{"prompt":"a"}`, want{}, "missing_required_parameter", "model"},

		{"detokenize", KindDetokenize, `{"model":"m","tokens":[1,2,-3]}`,
			want{model: "m", tokens: []int{1, 2, -3}, addGen: true, format: "float"}, "", ""},
		{"detokenize empty", KindDetokenize, `{"model":"m","tokens":[]}`, want{model: "m", tokens: []int{}, addGen: true, format: "float"}, "", ""},
		{"detokenize missing", KindDetokenize, `{"model":"m"}`, want{}, "missing_required_parameter", "tokens"},
		{"detokenize strings", KindDetokenize, `{"model":"m","tokens":["a"]}`, want{}, "invalid_type", "tokens"},
		{"detokenize decimal", KindDetokenize, `{"model":"m","tokens":[1.5]}`, want{}, "invalid_type", "tokens"},
		{"detokenize not an array", KindDetokenize, `{"model":"m","tokens":7}`, want{}, "invalid_type", "tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ReadRequest(tc.kind, []byte(tc.body), "")
			if tc.code != "" {
				if err == nil {
					t.Fatalf("no error; want %s", tc.code)
				}
				if err.Status != 400 || err.Body.Code == nil || *err.Body.Code != tc.code {
					t.Fatalf("error %d %s; want 400 %s", err.Status, err.JSON(), tc.code)
				}
				if err.Body.Param == nil || *err.Body.Param != tc.param {
					t.Fatalf("param of %s; want %q", err.JSON(), tc.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err.JSON())
			}
			got := want{model: r.Model, texts: r.Input.Texts(), ids: r.Input.TokenIDs(), format: r.EncodingFormat,
				dims: r.Dimensions, user: r.User, addGen: r.AddGenerationPrompt, cont: r.ContinueFinalMessage,
				strs: r.ReturnTokenStrs, messages: len(r.Messages), tokens: r.Tokens, generates: r.Kind.Generates(),
				inputCount: r.Input.Len()}
			if tc.kind == KindTokenize {
				if ps := r.Prompt.Texts(); len(ps) == 1 {
					got.prompt = ps[0]
				}
			}
			if tc.kind != KindEmbedding {
				got.inputCount = 0
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got  %+v\n want %+v", got, tc.want)
			}
		})
	}
}

func TestKinds(t *testing.T) {
	for _, k := range []Kind{KindChat, KindCompletion, KindEmbedding, KindTokenize, KindDetokenize} {
		if !k.Valid() {
			t.Errorf("%s not valid", k)
		}
		if gen := k == KindChat || k == KindCompletion; k.Generates() != gen {
			t.Errorf("%s: Generates %v", k, k.Generates())
		}
	}
	for _, k := range []Kind{"", "Chat", "embeddings", "score"} {
		if k.Valid() {
			t.Errorf("%q valid", k)
		}
	}
}

// FuzzReadRequestKinds: for every kind, ReadRequest never panics, refuses
// with a 400 only, and agrees with encoding/json on what is JSON.
func FuzzReadRequestKinds(f *testing.F) {
	for _, s := range []string{
		`{"model":"e","input":["a",""],"encoding_format":"base64","dimensions":3}`,
		`{"model":"e","input":[[1,2],[]],"user":"u"}`, `{"model":"e","input":[1,"a"]}`,
		`{"model":"m","prompt":"x","return_token_strs":true}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"continue_final_message":true}`,
		`{"model":"m","tokens":[1,-2,3.5]}`, `{"tokens":null,"model":"m"}`, `{}`, `[]`,
	} {
		for k := range 3 {
			f.Add(s, uint8(k))
		}
	}
	kinds := []Kind{KindEmbedding, KindTokenize, KindDetokenize}
	f.Fuzz(func(t *testing.T, body string, k uint8) {
		kind := kinds[int(k)%len(kinds)]
		r, err := ReadRequest(kind, []byte(body), "")
		if err != nil {
			if err.Status != 400 {
				t.Fatalf("%s: status %d", body, err.Status)
			}
			return
		}
		if !validJSON([]byte(body)) {
			t.Fatalf("%s: accepted, but it is not JSON", body)
		}
		if r.Model == "" {
			t.Fatalf("%s: accepted without a model", body)
		}
		switch kind {
		case KindEmbedding:
			if (r.Input.Len() < 1) == (len(r.Messages) < 1) || (r.EncodingFormat != EncodingFloat && r.EncodingFormat != EncodingBase64) || r.Dimensions < 0 {
				t.Fatalf("%s: accepted %+v", body, r)
			}
			for _, s := range r.Input.Texts() {
				if s == "" {
					t.Fatalf("%s: accepted an empty input", body)
				}
			}
		case KindDetokenize:
			if r.Tokens == nil {
				t.Fatalf("%s: accepted without tokens", body)
			}
		}
	})
}
