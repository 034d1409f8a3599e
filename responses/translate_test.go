package responses

import (
	"encoding/json"
	"testing"
)

func TestChatBody(t *testing.T) {
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
		{"image", `[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]`, "", true},
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
