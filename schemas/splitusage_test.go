package schemas

import "testing"

func TestSplitUsage(t *testing.T) {
	for _, tc := range []struct {
		name, in, choices, usage string
	}{
		{"transformers serve's last chat chunk",
			`{"id":"a","choices":[{"delta":{},"index":0,"finish_reason":"length"}],"model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":5,"prompt_tokens":17,"total_tokens":22}}`,
			`{"id":"a","choices":[{"delta":{},"index":0,"finish_reason":"length"}],"model":"m","object":"chat.completion.chunk","usage":null}`,
			`{"id":"a","choices":[],"model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":5,"prompt_tokens":17,"total_tokens":22}}`},
		{"usage first, spaces",
			`{ "usage" : {"total_tokens":1} , "choices" : [ {"text":"x"} ] }`,
			`{ "usage" : null , "choices" : [ {"text":"x"} ] }`,
			`{ "usage" : {"total_tokens":1} , "choices" : [] }`},
		{"OpenAI's usage chunk: nothing to split", `{"choices":[],"usage":{"total_tokens":1}}`, "", ""},
		{"empty choices with spaces", `{"choices":[ ],"usage":{"total_tokens":1}}`, "", ""},
		{"usage null", `{"choices":[{"text":"x"}],"usage":null}`, "", ""},
		{"no usage", `{"choices":[{"text":"x"}]}`, "", ""},
		{"not JSON", `{"choices":[{"text":"x"}],"usage":{`, "", ""},
		{"a nested usage key is not the chunk's", `{"choices":[{"usage":{"x":1}}]}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, u, ok := SplitUsage([]byte(tc.in))
			if ok != (tc.choices != "") || string(c) != tc.choices || string(u) != tc.usage {
				t.Fatalf("got %v\n%s\n%s", ok, c, u)
			}
			if ok && (!validJSON(c) || !validJSON(u)) {
				t.Fatal("invalid JSON out")
			}
		})
	}
}

func FuzzSplitUsage(f *testing.F) {
	f.Add([]byte(`{"choices":[{"text":"x"}],"usage":{"total_tokens":1}}`))
	f.Fuzz(func(t *testing.T, d []byte) {
		c, u, ok := SplitUsage(d)
		if ok && (!validJSON(c) || !validJSON(u)) {
			t.Fatalf("invalid JSON out of %q: %q %q", d, c, u)
		}
	})
}
