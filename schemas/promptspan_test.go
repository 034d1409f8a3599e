package schemas

import "testing"

func TestPromptSpan(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, `[{"role":"user","content":"hi"}]`},
		{`{"prompt":"once upon","model":"m"}`, `"once upon"`},
		{`{"prompt":[1,2,3]}`, `[1,2,3]`},
		{`{"messages" : [ ] , "prompt":"x"}`, `[ ]`},
		{`{"mess\u0061ges":["a"]}`, `["a"]`},
		{`{"model":"m"}`, ``},
		{`not json`, ``},
		{`{"messages":[`, ``},
	}
	for _, tt := range tests {
		if got := string(PromptSpan([]byte(tt.body))); got != tt.want {
			t.Errorf("PromptSpan(%s) = %q, want %q", tt.body, got, tt.want)
		}
	}
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"}]}`)
	if n := testing.AllocsPerRun(100, func() { PromptSpan(body) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
