package schemas

import (
	"reflect"
	"testing"
)

// response_format, tools, tool_choice, logprobs, reasoning_effort: read for
// the engine, JSON types checked, schemas kept raw.
func TestReadRequestToolsAndFormats(t *testing.T) {
	chat := func(extra string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	type want struct {
		format   ResponseFormat
		tools    []Tool
		choice   ToolChoice
		parallel bool
		logprobs bool
		top      int
		effort   string
	}
	for _, tc := range []struct {
		name  string
		kind  Kind
		body  string
		want  want
		param string // the 400's param; "" for success
	}{
		{"none", KindChat, chat(""), want{parallel: true}, ""},
		{"json_schema", KindChat, chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"Pet","schema":{"type":"object","properties":{}},"strict":true,"description":"x"}}`),
			want{format: ResponseFormat{Type: "json_schema", Name: "Pet", Schema: []byte(`{"type":"object","properties":{}}`), Strict: true, HasJSONSchema: true}, parallel: true}, ""},
		{"json_object", KindCompletion, `{"model":"m","prompt":"p","response_format":{"type":"json_object"}}`,
			want{format: ResponseFormat{Type: "json_object"}, parallel: true}, ""},
		{"tools and a named choice", KindChat, chat(`,"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object"}}},{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false`),
			want{tools: []Tool{{Type: "function", Name: "get_weather", Description: "Weather in a city", Parameters: []byte(`{"type":"object"}`), HasFunction: true},
				{Type: "function", Name: "f", HasFunction: true}}, choice: ToolChoice{Mode: "function", Name: "f"}}, ""},
		{"string choice", KindChat, chat(`,"tools":[],"tool_choice":"required"`), want{tools: []Tool{}, choice: ToolChoice{Mode: "required"}, parallel: true}, ""},
		{"nulls", KindChat, chat(`,"tools":null,"tool_choice":null,"response_format":null,"logprobs":null,"top_logprobs":null,"reasoning_effort":null,"parallel_tool_calls":null`),
			want{parallel: true}, ""},
		{"chat logprobs", KindChat, chat(`,"logprobs":true,"top_logprobs":3,"reasoning_effort":"high"`), want{parallel: true, logprobs: true, top: 3, effort: "high"}, ""},
		{"completions logprobs", KindCompletion, `{"model":"m","prompt":"p","logprobs":0}`, want{parallel: true, logprobs: true}, ""},
		{"tools are chat's", KindCompletion, `{"model":"m","prompt":"p","tools":7,"top_logprobs":"x"}`, want{parallel: true}, ""},

		{"response_format a string", KindChat, chat(`,"response_format":"json"`), want{}, "response_format"},
		{"type a number", KindChat, chat(`,"response_format":{"type":1}`), want{}, "response_format.type"},
		{"schema an array", KindChat, chat(`,"response_format":{"type":"json_schema","json_schema":{"schema":[]}}`), want{}, "response_format.json_schema.schema"},
		{"strict a string", KindChat, chat(`,"response_format":{"type":"json_schema","json_schema":{"strict":"yes"}}`), want{}, "response_format.json_schema.strict"},
		{"repeated type", KindChat, chat(`,"response_format":{"type":"text","type":"json_object"}`), want{}, "response_format.type"},
		{"tools an object", KindChat, chat(`,"tools":{}`), want{}, "tools"},
		{"tool not an object", KindChat, chat(`,"tools":[{"type":"function"},1]`), want{}, "tools[1]"},
		{"function name a number", KindChat, chat(`,"tools":[{"type":"function","function":{"name":1}}]`), want{}, "tools[0].function.name"},
		{"parameters a string", KindChat, chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}]`), want{}, "tools[0].function.parameters"},
		{"repeated parameters", KindChat, chat(`,"tools":[{"function":{"parameters":{},"parameters":{}}}]`), want{}, "tools[0].function.parameters"},
		{"tool_choice a number", KindChat, chat(`,"tool_choice":1`), want{}, "tool_choice"},
		{"tool_choice name a number", KindChat, chat(`,"tool_choice":{"type":"function","function":{"name":2}}`), want{}, "tool_choice.function.name"},
		{"parallel a string", KindChat, chat(`,"parallel_tool_calls":"no"`), want{}, "parallel_tool_calls"},
		{"chat logprobs a number", KindChat, chat(`,"logprobs":2`), want{}, "logprobs"},
		{"completions logprobs a boolean", KindCompletion, `{"model":"m","prompt":"p","logprobs":true}`, want{}, "logprobs"},
		{"top_logprobs a decimal", KindChat, chat(`,"top_logprobs":1.5`), want{}, "top_logprobs"},
		{"reasoning_effort a number", KindChat, chat(`,"reasoning_effort":1`), want{}, "reasoning_effort"},
		{"repeated tools", KindChat, chat(`,"tools":[],"tools":[]`), want{}, "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ReadRequest(tc.kind, []byte(tc.body), "")
			if tc.param != "" {
				if err == nil {
					t.Fatalf("accepted: %+v", r)
				}
				if err.Status != 400 || err.Body.Param == nil || *err.Body.Param != tc.param {
					t.Fatalf("error %s, want a 400 about %q", err.JSON(), tc.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err.JSON())
			}
			got := want{format: r.ResponseFormat, tools: r.Tools, choice: r.ToolChoice, parallel: r.ParallelToolCalls,
				logprobs: r.Logprobs, top: r.TopLogprobs, effort: r.ReasoningEffort}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got  %+v\n want %+v", got, tc.want)
			}
		})
	}
}

// A request without these fields allocates nothing more for them.
func TestReadRequestToolsNoAllocsWhenAbsent(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`)
	base := testing.AllocsPerRun(100, func() { ReadRequest(KindChat, body, "") })
	with := []byte(`{"model":"m","stream":true,"max_tokens":64,"logprobs":true,"top_logprobs":2,"parallel_tool_calls":false,"tool_choice":"auto","messages":[{"role":"user","content":"hi"}]}`)
	got := testing.AllocsPerRun(100, func() { ReadRequest(KindChat, with, "") })
	if got != base {
		t.Errorf("%v allocations with scalar tool fields, %v without", got, base)
	}
}
