package schemas

import (
	"strings"
	"testing"
)

func TestModelToken(t *testing.T) {
	tests := []struct{ model, token string }{
		{"llama-8b", "llama-8b"},
		{"meta-llama/Llama-3.1-8B", "meta-llama~2fLlama-3~2e1-8B"},
		{"a.b*c>d e", "a~2eb~2ac~3ed~20e"},
		{"tilde~x", "tilde~7ex"},
		{"ünï", "~c3~bcn~c3~af"},
	}
	for _, tt := range tests {
		if got := ModelToken(tt.model); got != tt.token {
			t.Errorf("ModelToken(%q) = %q, want %q", tt.model, got, tt.token)
		}
		if !ValidToken(tt.token) {
			t.Errorf("token %q is not a valid subject token", tt.token)
		}
		back, err := ParseModelToken(tt.token)
		if err != nil || back != tt.model {
			t.Errorf("ParseModelToken(%q) = %q, %v; want %q", tt.token, back, err, tt.model)
		}
	}
	for _, bad := range []string{"", "~", "~2", "~zz", "~41", "a.b", "a~2Eb", "x*"} {
		if m, err := ParseModelToken(bad); err == nil {
			t.Errorf("ParseModelToken(%q) = %q, want an error", bad, m)
		}
	}
}

func TestReqSubjectRoundTrip(t *testing.T) {
	m := "Qwen/Qwen2.5-7B-Instruct"
	got, ok := ModelFromReqSubject(ReqSubject(m))
	if !ok || got != m {
		t.Fatalf("got %q %v", got, ok)
	}
	if _, ok := ModelFromReqSubject("tokenbus.v1.work.x"); ok {
		t.Fatal("a work subject is not a request subject")
	}
}

func FuzzModelToken(f *testing.F) {
	for _, s := range []string{"llama-8b", "meta-llama/Llama-3.1-8B", "~", "a.b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, model string) {
		tok := ModelToken(model)
		if model != "" && !ValidToken(tok) {
			t.Fatalf("ModelToken(%q) = %q is not a subject token", model, tok)
		}
		if strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("token %q has subject metacharacters", tok)
		}
		if model == "" {
			return
		}
		back, err := ParseModelToken(tok)
		if err != nil || back != model {
			t.Fatalf("round trip %q -> %q -> %q, %v", model, tok, back, err)
		}
		// Parsing arbitrary input must never panic, and what parses must re-encode to itself.
		if m, err := ParseModelToken(model); err == nil && ModelToken(m) != model {
			t.Fatalf("ParseModelToken(%q) = %q but it encodes to %q", model, m, ModelToken(m))
		}
	})
}
