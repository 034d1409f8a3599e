package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

const weatherTools = `"tools":[
	{"type":"function","function":{"name":"get_weather","description":"Current weather in a city","strict":true,
		"parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}}},
	{"type":"function","function":{"name":"get_time","description":"The time in a timezone","parameters":{"type":"object","properties":{"timezone":{"type":"string"}},"required":["timezone"]}}},
	{"type":"function","function":{"name":"search_web","description":"Search the web for pages"}}]`

var toolParams = map[string]string{
	"get_weather": `{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}`,
	"get_time":    `{"type":"object","properties":{"timezone":{"type":"string"}},"required":["timezone"]}`,
	"search_web":  `{"type":"object","maxProperties":0}`, // no parameters: {}
}

func chatWithTools(messages, extra string) string {
	return `{"model":"sim","messages":` + messages + `,` + weatherTools + extra + `}`
}

func user(text string) string { return `[{"role":"user","content":` + jsonQuote(text) + `}]` }

func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// The tool-call rule, non-stream and streamed: which tools, their
// arguments valid, finish_reason tool_calls, content null, usage counting
// the arguments' tokens, the same answer for the same request.
func TestToolCalls(t *testing.T) {
	e := newEngine(t, fastConfig())
	afterTool := `[{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"{\"temperature\": 21}"}]`
	for _, tc := range []struct {
		name, messages, extra string
		calls                 []string // tools called, in order; nil: text
		text                  string   // the text answer, when fixed
	}{
		{"auto picks by words", user("What is the weather like in Paris today?"), "", []string{"get_weather"}, ""},
		{"auto picks by description", user("Which time is it in Tokyo?"), `,"tool_choice":"auto"`, []string{"get_time"}, ""},
		{"auto: camel and snake case split", user("please search for pages about cats"), "", []string{"search_web"}, ""},
		{"auto: no word in common, the first tool", user("Hello!"), "", []string{"get_weather"}, ""},
		{"auto: named tools, in the text's order", user("Call get_time and then get_weather for Oslo"), "", []string{"get_time", "get_weather"}, ""},
		{"auto: named tools, parallel off", user("Call get_time and then get_weather"), `,"parallel_tool_calls":false`, []string{"get_time"}, ""},
		{"auto: a name inside a longer word does not count", user("use get_timezone_info"), "", []string{"get_time"}, ""},
		{"auto after a tool result: text quoting it", afterTool, "", nil, `The result is: {"temperature": 21}`},
		{"auto after a system message: text", `[{"role":"system","content":"weather"}]`, "", nil, ""},
		{"required", user("Hello!"), `,"tool_choice":"required"`, []string{"get_weather"}, ""},
		{"required after a tool result: the last user message's pick", afterTool, `,"tool_choice":"required"`, []string{"get_weather"}, ""},
		{"named", user("What is the weather?"), `,"tool_choice":{"type":"function","function":{"name":"search_web"}}`, []string{"search_web"}, ""},
		{"none", user("What is the weather?"), `,"tool_choice":"none"`, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := chatWithTools(tc.messages, tc.extra)
			whole := chatAnswer(t, e, body)
			streamed := chatStream(t, e, body[:len(body)-1]+`,"stream":true,"stream_options":{"include_usage":true}}`)
			for _, a := range []answer{whole, streamed} {
				if tc.calls == nil {
					if a.calls != nil || a.finish != "stop" || a.contentNull || a.content == "" {
						t.Fatalf("want text: %+v", a)
					}
					if tc.text != "" && a.content != tc.text {
						t.Errorf("text %q, want %q", a.content, tc.text)
					}
					continue
				}
				if a.finish != "tool_calls" || len(a.calls) != len(tc.calls) {
					t.Fatalf("want calls %v: %+v", tc.calls, a)
				}
				args := ""
				for i, c := range a.calls {
					if c.Function.Name != tc.calls[i] || c.Type != "function" || !strings.HasPrefix(c.ID, "call_") || len(c.ID) != 29 {
						t.Errorf("call %d: %+v, want %s", i, c, tc.calls[i])
					}
					validate(t, compileTestSchema(t, toolParams[c.Function.Name]), c.Function.Arguments)
					args += c.Function.Arguments
				}
				if a.usage.CompletionTokens != countTokens(t, args) && len(a.calls) == 1 {
					t.Errorf("usage %+v for arguments %q (%d tokens)", a.usage, args, countTokens(t, args))
				}
			}
			if whole.contentNull != (tc.calls != nil) {
				t.Errorf("content null %v with calls %v", whole.contentNull, tc.calls)
			}
			if streamed.content != whole.content || len(streamed.calls) != len(whole.calls) || streamed.usage.CompletionTokens != whole.usage.CompletionTokens {
				t.Fatalf("streamed %+v, whole %+v", streamed, whole)
			}
			for i := range whole.calls {
				if streamed.calls[i] != whole.calls[i] {
					t.Errorf("streamed call %+v, whole %+v", streamed.calls[i], whole.calls[i])
				}
			}
			if tc.calls != nil && streamed.deltas < 2*len(tc.calls) && tc.calls[0] != "search_web" {
				t.Errorf("arguments in %d deltas", streamed.deltas)
			}
			again := chatAnswer(t, e, body)
			if again.content != whole.content || len(again.calls) != len(whole.calls) || again.usage.CompletionTokens != whole.usage.CompletionTokens {
				t.Errorf("again %+v, first %+v", again, whole)
			}
			for i := range whole.calls {
				if again.calls[i] != whole.calls[i] {
					t.Errorf("again call %+v, first %+v", again.calls[i], whole.calls[i])
				}
			}
		})
	}
}

// max_tokens cuts the arguments: finish_reason length, a prefix of them.
func TestToolCallCut(t *testing.T) {
	e := newEngine(t, fastConfig())
	body := chatWithTools(user("weather in Rome"), `,"tool_choice":"required","seed":3`)
	full := chatAnswer(t, e, body)
	cut := chatAnswer(t, e, strings.Replace(body, `"seed":3`, `"seed":3,"max_tokens":3`, 1))
	if cut.finish != "length" || len(cut.calls) != 1 || cut.usage.CompletionTokens != 3 ||
		!strings.HasPrefix(full.calls[0].Function.Arguments, cut.calls[0].Function.Arguments) || cut.calls[0].ID != full.calls[0].ID {
		t.Fatalf("cut %+v of %+v", cut, full)
	}
	s := chatStream(t, e, strings.Replace(body, `"seed":3`, `"seed":3,"max_tokens":3,"stream":true`, 1))
	if s.finish != "length" || s.calls[0] != cut.calls[0] {
		t.Fatalf("cut stream %+v, want %+v", s, cut)
	}
}

func TestToolErrors(t *testing.T) {
	e := newEngine(t, fastConfig())
	msgs := `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct{ body, param, code string }{
		{`{"model":"sim",` + msgs + `,` + weatherTools + `,"tool_choice":{"type":"function","function":{"name":"nope"}}}`, "tool_choice.function.name", "invalid_value"},
		{`{"model":"sim",` + msgs + `,` + weatherTools + `,"tool_choice":{"type":"function"}}`, "tool_choice.function.name", "missing_required_parameter"},
		{`{"model":"sim",` + msgs + `,` + weatherTools + `,"tool_choice":"sometimes"}`, "tool_choice", "invalid_value"},
		{`{"model":"sim",` + msgs + `,"tool_choice":"required"}`, "tool_choice", "invalid_value"},
		{`{"model":"sim",` + msgs + `,"tools":[{"type":"code_interpreter"}]}`, "tools[0].type", "invalid_value"},
		{`{"model":"sim",` + msgs + `,"tools":[{"type":"function"}]}`, "tools[0].function", "missing_required_parameter"},
		{`{"model":"sim",` + msgs + `,"tools":[{"type":"function","function":{"description":"d"}}]}`, "tools[0].function.name", "missing_required_parameter"},
		{`{"model":"sim",` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"$ref":"#/$defs/A"}}}}}]}`,
			"tools[0].function.parameters", "invalid_value"},
		{`{"model":"sim",` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]}`, "tools[0].function.parameters", "invalid_type"},
	} {
		_, err := gen(t, e, schemas.KindChat, tc.body, nil)
		if err == nil {
			t.Errorf("%s: accepted", tc.body)
			continue
		}
		if se := asError(t, err); se.Status != 400 || *se.Body.Param != tc.param || *se.Body.Code != tc.code {
			t.Errorf("%s: %s, want a 400 %s about %s", tc.body, se.JSON(), tc.code, tc.param)
		}
	}
	// "none" needs no tools; empty tools are no tools.
	for _, extra := range []string{`,"tool_choice":"none"`, `,"tools":[]`} {
		if a := chatAnswer(t, e, `{"model":"sim",`+msgs+extra+`}`); a.calls != nil || a.content == "" {
			t.Errorf("%s: %+v", extra, a)
		}
	}
}

// An agent's conversation as the SDKs send it back: assistant messages with
// tool_calls (content null or absent), tool messages with tool_call_id,
// content as parts.
func TestToolConversationAccepted(t *testing.T) {
	e := newEngine(t, fastConfig())
	msgs := `[{"role":"system","content":"You help."},{"role":"user","content":[{"type":"text","text":"Weather in Oslo and Rome?"}]},
		{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"get_weather","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"a","content":"Oslo: 3 C"},{"role":"tool","tool_call_id":"b","content":[{"type":"text","text":"Rome: 18 C"}]}]`
	a := chatAnswer(t, e, chatWithTools(msgs, ""))
	if a.content != "The result is: Oslo: 3 C; Rome: 18 C" || a.finish != "stop" {
		t.Fatalf("%+v", a)
	}
}
