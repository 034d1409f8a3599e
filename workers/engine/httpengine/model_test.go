package httpengine

import "testing"

func TestModelNameFix(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		want   []string
	}{
		{"the same name: untouched",
			[]string{`{"id":"a","model":"m","choices":[]}`, `{"id":"a","model":"m"}`},
			[]string{`{"id":"a","model":"m","choices":[]}`, `{"id":"a","model":"m"}`}},
		{"the engine's own name: the requested one",
			[]string{`{"id":"a","model":"m@main","choices":[{"delta":{"content":"x"}}]}`, `{"model" : "m@main","usage":{}}`},
			[]string{`{"id":"a","model":"m","choices":[{"delta":{"content":"x"}}]}`, `{"model" : "m","usage":{}}`}},
		{"no model member",
			[]string{`{"id":"a","choices":[]}`, `{"id":"a","model":"other"}`},
			[]string{`{"id":"a","choices":[]}`, `{"id":"a","model":"other"}`}},
		{"model inside a string is not the member",
			[]string{`{"choices":[{"delta":{"content":"\"model\":\"x\""}}],"model":"m@main"}`},
			[]string{`{"choices":[{"delta":{"content":"\"model\":\"x\""}}],"model":"m"}`}},
		{"a later chunk naming yet another model is left alone",
			[]string{`{"model":"m@main"}`, `{"model":"n"}`},
			[]string{`{"model":"m"}`, `{"model":"n"}`}},
		{"escapes in the engine's name",
			[]string{`{"model":"m\"q"}`, `{"model":"m\"q","x":1}`},
			[]string{`{"model":"m"}`, `{"model":"m","x":1}`}},
		{"model not a string", []string{`{"model":null,"id":"a"}`}, []string{`{"model":null,"id":"a"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newModelName("m")
			for i, c := range tc.chunks {
				if got := string(m.fix([]byte(c))); got != tc.want[i] {
					t.Errorf("chunk %d: %s, want %s", i, got, tc.want[i])
				}
			}
		})
	}
	var zero modelName // sseState in tests: no requested name, nothing rewritten
	if got := string(zero.fix([]byte(`{"model":"x"}`))); got != `{"model":"x"}` {
		t.Errorf("zero value rewrote: %s", got)
	}
}

func TestModelNameSameNameAllocatesNothing(t *testing.T) {
	m := newModelName("meta-llama/Llama-3.1-8B-Instruct")
	d := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" the"},"finish_reason":null}]}`)
	if n := testing.AllocsPerRun(100, func() { m.fix(d) }); n != 0 {
		t.Fatalf("%v allocations per chunk", n)
	}
}
