package responses

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestChatMessages(t *testing.T) {
	tests := []struct {
		name, input string
		want        string // the messages the engine gets
		wantErr     bool
	}{
		{"string", `"hi"`, `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`, false},
		{"parts", `[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]`,
			`[{"role":"system","content":"be brief"},{"role":"user","content":"ab"}]`, false},
		{"tool turn", `[{"role":"user","content":"q"},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"42"}]`,
			`[{"role":"system","content":"be brief"},{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42","tool_call_id":"c1"}]`, false},
		{"parallel calls are one assistant turn", `[{"role":"user","content":"q"},` +
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"g","arguments":"{\"x\":1}"},` +
			`{"type":"function_call_output","call_id":"c1","output":"1"},{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"2"}]}]`,
			`[{"role":"system","content":"be brief"},{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[` +
				`{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{\"x\":1}"}}]},` +
				`{"role":"tool","content":"1","tool_call_id":"c1"},{"role":"tool","content":"2","tool_call_id":"c2"}]`, false},
		{"an earlier output given back (reasoning, message with logprobs)", `[{"role":"user","content":"q"},` +
			`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}],"status":"completed"},` +
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"a","annotations":[],"logprobs":[]}]},` +
			`{"role":"developer","content":"again"}]`,
			`[{"role":"system","content":"be brief"},{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"system","content":"again"}]`, false},
		{"image", `[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]`, "", true},
		{"image output", `[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"x"}]}]`, "", true},
		{"item reference without an id", `[{"type":"item_reference"}]`, "", true},
		{"output missing", `[{"type":"function_call_output","call_id":"c"}]`, "", true},
		{"empty", `[]`, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			instr := "be brief"
			req := &CreateRequest{Model: "m", Input: json.RawMessage(tt.input), Instructions: &instr}
			items, err := Items(req.Input)
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			body, err := ChatBody(req, nil, items)
			if err != nil {
				t.Fatal(err)
			}
			var got struct{ Messages json.RawMessage }
			if err := json.Unmarshal(body, &got); err != nil || string(got.Messages) != tt.want {
				t.Fatalf("messages %s (%v), want %s", got.Messages, err, tt.want)
			}
		})
	}
}

// TestChatBody: each Responses field to the chat request's.
func TestChatBody(t *testing.T) {
	const tools = `"tools":[{"type":"function","name":"get_weather","description":"w","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},{"type":"function","name":"f"}]`
	const chatTools = `[{"type":"function","function":{"name":"get_weather","description":"w","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}},{"type":"function","function":{"name":"f"}}]`
	tests := []struct {
		name string
		body string            // the Responses request's fields besides model and input
		want map[string]string // chat fields, as JSON; "" is absent
	}{
		{"plain", `"max_output_tokens":5,"temperature":0.5,"top_p":0.9,"user":"u"`,
			map[string]string{"max_tokens": "5", "temperature": "0.5", "top_p": "0.9", "user": `"u"`, "stream": "true",
				"stream_options": `{"include_usage":true}`, "response_format": "", "tools": "", "tool_choice": "", "logprobs": "", "reasoning_effort": ""}},
		{"json_schema", `"text":{"format":{"type":"json_schema","name":"Person","schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]},"strict":true,"description":"a person"}}`,
			map[string]string{"response_format": `{"json_schema":{"description":"a person","name":"Person","schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]},"strict":true},"type":"json_schema"}`}},
		{"json_object", `"text":{"format":{"type":"json_object"}}`, map[string]string{"response_format": `{"type":"json_object"}`}},
		{"text", `"text":{"format":{"type":"text"},"verbosity":"medium"}`, map[string]string{"response_format": ""}},
		{"tools, auto", tools + `,"tool_choice":"auto","parallel_tool_calls":false`,
			map[string]string{"tools": chatTools, "tool_choice": `"auto"`, "parallel_tool_calls": "false"}},
		{"tools, required", tools + `,"tool_choice":"required"`, map[string]string{"tool_choice": `"required"`}},
		{"tools, none", tools + `,"tool_choice":"none"`, map[string]string{"tool_choice": `"none"`}},
		{"tools, named", tools + `,"tool_choice":{"type":"function","name":"f"}`,
			map[string]string{"tool_choice": `{"function":{"name":"f"},"type":"function"}`}},
		{"tools, allowed", tools + `,"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"f"}]}`,
			map[string]string{"tools": `[{"type":"function","function":{"name":"f"}}]`, "tool_choice": `"required"`}},
		{"no tools, auto", `"tool_choice":"auto","parallel_tool_calls":true`, map[string]string{"tools": "", "tool_choice": "", "parallel_tool_calls": ""}},
		{"reasoning", `"reasoning":{"effort":"high","summary":"auto"}`, map[string]string{"reasoning_effort": `"high"`}},
		{"logprobs", `"include":["message.output_text.logprobs"],"top_logprobs":3`, map[string]string{"logprobs": "true", "top_logprobs": "3"}},
		{"logprobs, no top", `"include":["message.output_text.logprobs"]`, map[string]string{"logprobs": "true", "top_logprobs": ""}},
		{"top_logprobs alone asks for them", `"top_logprobs":2`, map[string]string{"logprobs": "true", "top_logprobs": "2"}},
		{"vLLM extras", `"top_k":5,"logit_bias":{"42":-100},"skip_special_tokens":false,"priority":-1,"cache_salt":"s"`,
			map[string]string{"top_k": "5", "logit_bias": `{"42":-100}`, "skip_special_tokens": "false", "priority": "-1", "cache_salt": `"s"`}},
		{"hints tokenbus keeps", `"prompt_cache_key":"k","safety_identifier":"s","service_tier":"flex","max_tool_calls":3,"truncation":"auto"`,
			map[string]string{"prompt_cache_key": "", "safety_identifier": "", "service_tier": "", "max_tool_calls": "", "truncation": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := Parse([]byte(`{"model":"m","input":"hi",` + tt.body + `}`))
			if err != nil {
				t.Fatal(err)
			}
			items, err := Items(req.Input)
			if err != nil {
				t.Fatal(err)
			}
			body, err := ChatBody(req, nil, items)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			for k, want := range tt.want {
				if want == "" {
					if v, ok := got[k]; ok {
						t.Errorf("%s = %s, want none", k, v)
					}
					continue
				}
				if g := string(got[k]); g != want && canonical(t, g) != canonical(t, want) {
					t.Errorf("%s = %s, want %s", k, g, want)
				}
			}
		})
	}
}

// TestParse: every field is read or refused with a 400 naming it.
func TestParse(t *testing.T) {
	tests := []struct {
		name, body  string
		code, param string // "" code: accepted
	}{
		{"minimal", `{"model":"m","input":"hi"}`, "", ""},
		{"every read field", `{"model":"m","input":"hi","instructions":"i","max_output_tokens":5,"temperature":1,"top_p":1,"stream":true,` +
			`"store":false,"background":false,"metadata":{"a":"b"},"previous_response_id":null,"tools":[],"tool_choice":"auto","parallel_tool_calls":true,` +
			`"user":"u","include":["message.output_text.logprobs"],"text":{"format":{"type":"text"},"verbosity":"medium"},"reasoning":{"effort":"low","summary":"auto","context":"auto","mode":"standard"},` +
			`"truncation":"disabled","top_logprobs":0,"max_tool_calls":2,"service_tier":"auto","safety_identifier":"s","prompt_cache_key":"k",` +
			`"prompt_cache_retention":"in_memory","stream_options":{"include_obfuscation":false},"top_k":1,"logit_bias":{},"skip_special_tokens":true,"priority":0,"cache_salt":"x"}`, "", ""},
		{"refused fields asking nothing", `{"model":"m","input":"hi","conversation":null,"prompt":null,"moderation":null,"context_management":[],"prompt_cache_options":{},"enable_response_messages":false}`, "", ""},
		{"unknown", `{"model":"m","input":"hi","frequency_penalty":1}`, "unknown_parameter", "frequency_penalty"},
		{"unknown in text", `{"model":"m","input":"hi","text":{"format":{"type":"text"},"style":"terse"}}`, "unknown_parameter", "text.style"},
		{"unknown in reasoning", `{"model":"m","input":"hi","reasoning":{"effort":"low","budget":100}}`, "unknown_parameter", "reasoning.budget"},
		{"unknown, sorted first", `{"model":"m","input":"hi","zeta":1,"alpha":2}`, "unknown_parameter", "alpha"},
		{"conversation", `{"model":"m","input":"hi","conversation":"conv_1"}`, "unsupported_parameter", "conversation"},
		{"prompt", `{"model":"m","input":"hi","prompt":{"id":"p"}}`, "unsupported_parameter", "prompt"},
		{"context_management", `{"model":"m","input":"hi","context_management":[{"type":"compaction"}]}`, "unsupported_parameter", "context_management"},
		{"request_id", `{"model":"m","input":"hi","request_id":"r"}`, "unsupported_parameter", "request_id"},
		{"include encrypted reasoning", `{"model":"m","input":"hi","include":["message.output_text.logprobs","reasoning.encrypted_content"]}`, "unsupported_value", "include[1]"},
		{"include a tool's", `{"model":"m","input":"hi","include":["file_search_call.results"]}`, "unsupported_value", "include[0]"},
		{"include nonsense", `{"model":"m","input":"hi","include":["x"]}`, "invalid_value", "include[0]"},
		{"truncation", `{"model":"m","input":"hi","truncation":"middle"}`, "invalid_value", "truncation"},
		{"format without name", `{"model":"m","input":"hi","text":{"format":{"type":"json_schema","schema":{}}}}`, "missing_required_parameter", "text.format.name"},
		{"format without schema", `{"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"n"}}}`, "missing_required_parameter", "text.format.schema"},
		{"format type", `{"model":"m","input":"hi","text":{"format":{"type":"grammar"}}}`, "invalid_value", "text.format.type"},
		{"verbosity", `{"model":"m","input":"hi","text":{"verbosity":"low"}}`, "unsupported_value", "text.verbosity"},
		{"summary", `{"model":"m","input":"hi","reasoning":{"summary":"detailed"}}`, "unsupported_value", "reasoning.summary"},
		{"reasoning context", `{"model":"m","input":"hi","reasoning":{"context":"all_turns"}}`, "unsupported_value", "reasoning.context"},
		{"priority tier", `{"model":"m","input":"hi","service_tier":"priority"}`, "unsupported_value", "service_tier"},
		{"24h cache", `{"model":"m","input":"hi","prompt_cache_retention":"24h"}`, "unsupported_value", "prompt_cache_retention"},
		{"stream_options without stream", `{"model":"m","input":"hi","stream_options":{}}`, "invalid_value", "stream_options"},
		{"obfuscation", `{"model":"m","input":"hi","stream":true,"stream_options":{"include_obfuscation":true}}`, "unsupported_value", "stream_options.include_obfuscation"},
		{"top_logprobs", `{"model":"m","input":"hi","top_logprobs":21}`, "integer_above_max_value", "top_logprobs"},
		{"max_output_tokens", `{"model":"m","input":"hi","max_output_tokens":0}`, "integer_below_min_value", "max_output_tokens"},
		{"a type", `{"model":"m","input":"hi","reasoning":{"effort":3}}`, "invalid_type", "reasoning.effort"},
		{"no model", `{"input":"hi"}`, "missing_required_parameter", "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.body))
			if tt.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			e := schemas.AsError(err)
			if err == nil || e.Status != 400 || e.Body.Code == nil || *e.Body.Code != tt.code || e.Body.Param == nil || *e.Body.Param != tt.param {
				t.Fatalf("got %v (%+v), want %s naming %s", err, e, tt.code, tt.param)
			}
			if tt.code == "unknown_parameter" && e.Body.Message != "Unknown parameter: '"+tt.param+"'." {
				t.Fatalf("message %q", e.Body.Message)
			}
		})
	}
}

// TestToolChoiceErrors: a tool choice that names no tool given is a 400
// naming the field.
func TestToolChoiceErrors(t *testing.T) {
	const tools = `"tools":[{"type":"function","name":"f"}]`
	for body, param := range map[string]string{
		`"tool_choice":"required"`:                              "tool_choice",
		tools + `,"tool_choice":{"type":"function","name":"g"}`: "tool_choice.name",
		tools + `,"tool_choice":{"type":"file_search"}`:         "tool_choice.type",
		tools + `,"tool_choice":"sometimes"`:                    "tool_choice",
		`"tools":[{"type":"web_search"}]`:                       "tools[0].type",
		tools + `,"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"x"}]}`: "tool_choice.tools[0].name",
	} {
		req, err := Parse([]byte(`{"model":"m","input":"hi",` + body + `}`))
		if err != nil {
			t.Fatal(err)
		}
		_, err = ChatBody(req, nil, nil)
		if e := schemas.AsError(err); err == nil || e.Body.Param == nil || *e.Body.Param != param {
			t.Errorf("%s: %v, want a 400 naming %s", body, err, param)
		}
	}
}

// TestResponseEcho: the response object echoes what was asked.
func TestResponseEcho(t *testing.T) {
	req, err := Parse([]byte(`{"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"P","schema":{"type":"object"},"strict":true}},` +
		`"reasoning":{"effort":"low"},"truncation":"auto","top_logprobs":2,"service_tier":"flex","prompt_cache_key":"k","safety_identifier":"s","max_tool_calls":4}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(New("resp_1", req, timeZero))
	for _, want := range []string{`"text":{"format":{"type":"json_schema","name":"P","schema":{"type":"object"},"strict":true},"verbosity":"medium"}`,
		`"reasoning":{"effort":"low","summary":null}`, `"truncation":"auto"`, `"top_logprobs":2`, `"service_tier":"flex"`,
		`"prompt_cache_key":"k"`, `"safety_identifier":"s"`, `"max_tool_calls":4`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("response %s\nlacks %s", b, want)
		}
	}
	b, _ = json.Marshal(New("resp_2", &CreateRequest{Model: "m"}, timeZero))
	for _, want := range []string{`"text":{"format":{"type":"text"},"verbosity":"medium"}`, `"reasoning":null`, `"truncation":"disabled"`, `"service_tier":"default"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("response %s\nlacks %s", b, want)
		}
	}
}

func TestContinued(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":10,"stream":true}`)
	out, done, err := continued(body, "partial", 4)
	if err != nil || done {
		t.Fatal(err, done)
	}
	var m struct {
		Messages  []chatMessage `json:"messages"`
		MaxTokens int           `json:"max_tokens"`
		Continue  bool          `json:"continue_final_message"`
	}
	if err := json.Unmarshal(out, &m); err != nil || m.MaxTokens != 6 || !m.Continue || len(m.Messages) != 2 || *m.Messages[1].Content != "partial" {
		t.Fatalf("%s %v", out, err)
	}
	if _, done, _ := continued(body, "x", 10); !done {
		t.Fatal("10 of 10 tokens: want done")
	}
}

var timeZero = time.Unix(0, 0)
