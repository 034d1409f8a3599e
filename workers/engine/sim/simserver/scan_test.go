package simserver

import (
	"encoding/json"
	"testing"
)

func TestScanTop(t *testing.T) {
	for _, tc := range []struct {
		body   string
		model  string
		stream bool
	}{
		{`{"model":"m","stream":true}`, "m", true},
		{` { "stream" : true , "model" : "m" } `, "m", true},
		{`{"stream":false,"model":"m"}`, "m", false},
		{`{"stream":null}`, "", false},
		{`{"messages":[{"role":"user","content":"\"stream\":true, \"model\":\"x\""}],"model":"m"}`, "m", false},
		{`{"extra":{"stream":true,"model":"inner"},"model":"outer"}`, "outer", false},
		{`{"model":"a","model":"b","stream":true,"stream":false}`, "b", false}, // the last one wins
		{`{"Model":"case","STREAM":true}`, "case", true},                       // encoding/json folds case
		{`{"model":"with \"quote\" and \u00e9"}`, `with "quote" and é`, false},
		{`{"mod\u0065l":"escaped key"}`, "escaped key", false},
		{`{"model":123,"stream":"true"}`, "", false},
		{`{"model":null}`, "", false},
		{`{"a":[1,[2,{"b":"]}"}]],"model":"m","stream":true}`, "m", true},
		{`[{"model":"m"}]`, "", false},
		{`{"model":"m","stream":tru`, "m", false},
		{`{"model":"m"`, "m", false},
		{`{"model":"unterminated`, "", false},
		{``, "", false},
	} {
		model, stream := scanTop([]byte(tc.body))
		if model != tc.model || stream != tc.stream {
			t.Errorf("scanTop(%s) = %q, %v; want %q, %v", tc.body, model, stream, tc.model, tc.stream)
		}
		// Where encoding/json reads the body, it agrees.
		var v struct {
			Model  *string `json:"model"`
			Stream *bool   `json:"stream"`
		}
		if json.Unmarshal([]byte(tc.body), &v) == nil {
			m := ""
			if v.Model != nil {
				m = *v.Model
			}
			if m != model || (v.Stream != nil && *v.Stream) != stream {
				t.Errorf("encoding/json reads %s as %q, %v", tc.body, m, v.Stream)
			}
		}
	}
}

func FuzzScanTop(f *testing.F) {
	f.Add(`{"model":"m","stream":true}`)
	f.Add(`{"a":[{"b":"\"c"}],"Model":"x\\y","stream":false}`)
	f.Fuzz(func(t *testing.T, body string) {
		model, stream := scanTop([]byte(body))
		var v struct {
			Model  *string `json:"model"`
			Stream *bool   `json:"stream"`
		}
		if json.Unmarshal([]byte(body), &v) != nil {
			return
		}
		m := ""
		if v.Model != nil {
			m = *v.Model
		}
		if m != model || (v.Stream != nil && *v.Stream) != stream {
			t.Errorf("scanTop(%q) = %q, %v; encoding/json: %q, %v", body, model, stream, m, v.Stream)
		}
	})
}
