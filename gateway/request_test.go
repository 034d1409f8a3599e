package gateway

import (
	"encoding/json"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		kind      schemas.Kind
		body      string
		pathModel string
		want      apiRequest // compared when param is ""
		param     string     // the 400's param, "-" for a 400 without one
	}{
		{"minimal chat", schemas.KindChat, `{"model":"m","messages":[{}]}`, "", apiRequest{Model: "m", N: 1}, ""},
		{"stream with options", schemas.KindChat, `{"model":"m","messages":[{}],"stream":true,"stream_options":{"include_usage":false},"n":3,"priority":-2}`, "",
			apiRequest{Model: "m", Stream: true, N: 3, Priority: -2}, ""},
		{"include_usage folds case, the last one wins", schemas.KindChat, `{"model":"m","messages":[{}],"stream":true,"stream_options":{"include_usage":false,"Include_Usage":true,"x":[1]}}`, "",
			apiRequest{Model: "m", Stream: true, IncludeUsage: true, N: 1}, ""},
		{"include_usage null means usage", schemas.KindChat, `{"model":"m","messages":[{}],"stream":true,"stream_options":{"include_usage":null}}`, "",
			apiRequest{Model: "m", Stream: true, IncludeUsage: true, N: 1}, ""},
		{"vLLM's empty stream_options means usage", schemas.KindChat, `{"model":"m","messages":[{}],"stream":true,"stream_options":{}}`, "",
			apiRequest{Model: "m", Stream: true, IncludeUsage: true, N: 1}, ""},
		{"nulls are absent", schemas.KindCompletion, `{"model":"m","prompt":"p","stream":null,"stream_options":null,"n":null,"priority":null}`, "",
			apiRequest{Model: "m", N: 1}, ""},
		{"escaped model", schemas.KindCompletion, `{"model":"a\/b\u00e9","prompt":[1]}`, "", apiRequest{Model: "a/bé", N: 1}, ""},
		{"escaped key", schemas.KindCompletion, `{"mod\u0065l":"m","prompt":"p"}`, "", apiRequest{Model: "m", N: 1}, ""},
		{"nested keys ignored", schemas.KindChat, `{"x":{"model":"evil","stream":"no"},"messages":[{"model":"e"}],"model":"m"}`, "", apiRequest{Model: "m", N: 1}, ""},
		{"strings with braces", schemas.KindChat, `{"x":"}\"{[","messages":[{"c":"]}\\"}],"model":"m"}`, "", apiRequest{Model: "m", N: 1}, ""},
		{"path model default", schemas.KindCompletion, `{"prompt":"p"}`, "pm", apiRequest{Model: "pm", N: 1, modelFromPath: true}, ""},
		{"body model wins", schemas.KindCompletion, `{"prompt":"p","model":"bm"}`, "pm", apiRequest{Model: "bm", N: 1}, ""},

		{"case-folded key is not the field", schemas.KindChat, `{"Model":"m","messages":[{}]}`, "", apiRequest{}, "model"},
		{"case-folded stream is not stream", schemas.KindChat, `{"model":"m","messages":[{}],"STREAM":true}`, "", apiRequest{Model: "m", N: 1}, ""},
		{"duplicate model", schemas.KindChat, `{"model":"a","messages":[{}],"model":"b"}`, "", apiRequest{}, "model"},
		{"duplicate via escape", schemas.KindChat, `{"model":"a","messages":[{}],"mod\u0065l":"b"}`, "", apiRequest{}, "model"},
		{"duplicate stream", schemas.KindChat, `{"model":"a","messages":[{}],"stream":false,"stream":true}`, "", apiRequest{}, "stream"},
		{"type errors come before missing or empty", schemas.KindChat, `{"model":"m","stream":"yes","messages":[]}`, "", apiRequest{}, "stream"},
		{"number n as float", schemas.KindChat, `{"model":"m","messages":[{}],"n":1.5}`, "", apiRequest{}, "n"},
		{"include_usage type", schemas.KindChat, `{"model":"m","messages":[{}],"stream":true,"stream_options":{"include_usage":"yes"}}`, "", apiRequest{}, "stream_options.include_usage"},
		{"stream_options not an object", schemas.KindChat, `{"model":"m","messages":[{}],"stream":true,"stream_options":true}`, "", apiRequest{}, "stream_options"},
		{"empty model", schemas.KindChat, `{"model":"","messages":[{}]}`, "", apiRequest{}, "model"},
		{"prompt number", schemas.KindCompletion, `{"model":"m","prompt":5}`, "", apiRequest{}, "prompt"},
		{"prompt empty array", schemas.KindCompletion, `{"model":"m","prompt":[ ]}`, "", apiRequest{}, "prompt"},
		{"trailing garbage", schemas.KindChat, `{"model":"m","messages":[{}]} x`, "", apiRequest{}, "-"},
		{"truncated", schemas.KindChat, `{"model":"m","messages":[{}`, "", apiRequest{}, "-"},
		{"array body", schemas.KindChat, `[{"model":"m"}]`, "", apiRequest{}, "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRequest(tc.kind, []byte(tc.body), tc.pathModel)
			if tc.param != "" {
				if err == nil {
					t.Fatalf("accepted: %+v", r)
				}
				param := "-"
				if err.Body.Param != nil {
					param = *err.Body.Param
				}
				if err.Status != 400 || param != tc.param {
					t.Fatalf("got %d param %q (%s), want param %q", err.Status, param, err.Body.Message, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if *r != tc.want {
				t.Fatalf("got %+v, want %+v", *r, tc.want)
			}
		})
	}
}

func TestPayloadInsertsPathModel(t *testing.T) {
	for body, want := range map[string]string{
		`{"prompt":"p"}`:          `{"model":"a/b","prompt":"p"}`,
		" \n{ \"prompt\":\"p\" }": " \n{\"model\":\"a/b\", \"prompt\":\"p\" }",
	} {
		r, err := parseRequest(schemas.KindCompletion, []byte(body), "a/b")
		if err != nil {
			t.Fatal(err)
		}
		if got := string(r.payload([]byte(body))); got != want {
			t.Errorf("payload %q, want %q", got, want)
		}
	}
	body := []byte(`{"prompt":"p","model":"x"}`)
	r, _ := parseRequest(schemas.KindCompletion, body, "a/b")
	out := r.payload(body)
	if string(out) != string(body) || &out[0] == &body[0] {
		t.Error("payload must be an exact copy")
	}
}

// FuzzParseRequest: parseRequest never panics, and what it accepts agrees
// with an exact-key decoding of the body.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{}]}`, `{"model":"m","messages":[{}],"stream":true,"stream_options":{}}`,
		`{"Model":"x","model":"m","messages":[1]}`, `{"a":{"model":1},"model":"m","messages":["}"]}`,
		`{"mod\u0065l":"m","messages":[{}]}`, `{"model":"m","messages":[{}],"n":2,"priority":1}`, `{}`, `[]`, `"x"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r, err := parseRequest(schemas.KindChat, []byte(body), "")
		if err != nil {
			return
		}
		var m map[string]json.RawMessage
		if e := json.Unmarshal([]byte(body), &m); e != nil {
			t.Fatalf("accepted a body encoding/json rejects: %v", e)
		}
		var model string
		if e := json.Unmarshal(m["model"], &model); e != nil || model != r.Model {
			t.Fatalf("model %q, exact-key decoding says %q (%v)", r.Model, model, e)
		}
		var stream bool
		_ = json.Unmarshal(m["stream"], &stream)
		if stream != r.Stream {
			t.Fatalf("stream %v, exact-key decoding says %v", r.Stream, stream)
		}
	})
}
