package responses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// The Responses API is translated to the engine's chat API, which every
// engine behind tokenbus serves (the sim, vLLM, SGLang, transformers
// serve); vLLM's own /v1/responses would serve only vLLM workers, and its
// background state is in one process's memory, which is what this package
// replaces.

// Items reads a request's input: a string (one user message) or a list of
// items: messages (with a string or a list of text parts as content),
// function calls and function call outputs. Each item gets an id.
func Items(input json.RawMessage) ([]Item, error) {
	in := bytes.TrimSpace(input)
	if len(in) == 0 || string(in) == "null" {
		return nil, schemas.ErrMissingParam.At("input", "input")
	}
	if in[0] == '"' {
		var s string
		if err := json.Unmarshal(in, &s); err != nil {
			return nil, schemas.ErrInvalidType.At("input", "input", "a string or an array", "invalid JSON")
		}
		return []Item{{Type: "message", ID: "msg_" + nuid.Next(), Status: StatusCompleted, Role: "user",
			Content: []Content{{Type: "input_text", Text: s}}}}, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(in, &raw); err != nil {
		return nil, schemas.ErrInvalidType.At("input", "input", "a string or an array", "another type")
	}
	if len(raw) == 0 {
		return nil, schemas.ErrEmptyArray.At("input", "input")
	}
	items := make([]Item, 0, len(raw))
	for i, r := range raw {
		it, err := item(r, fmt.Sprintf("input[%d]", i))
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

func item(raw json.RawMessage, param string) (Item, error) {
	var v struct {
		Type      string          `json:"type"`
		ID        string          `json:"id"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments string          `json:"arguments"`
		Output    json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return Item{}, schemas.ErrInvalidType.At(param, param, "an object", "another type")
	}
	id := v.ID
	switch v.Type {
	case "", "message":
		switch v.Role {
		case "user", "assistant", "system", "developer":
		default:
			return Item{}, schemas.ErrResponseInput.At(param+".role", param+".role", "expected user, assistant, system or developer")
		}
		parts, err := contentParts(v.Content, v.Role, param+".content")
		if err != nil {
			return Item{}, err
		}
		if id == "" {
			id = "msg_" + nuid.Next()
		}
		return Item{Type: "message", ID: id, Status: StatusCompleted, Role: v.Role, Content: parts}, nil
	case "function_call":
		if id == "" {
			id = "fc_" + nuid.Next()
		}
		return Item{Type: "function_call", ID: id, Status: StatusCompleted, CallID: v.CallID, Name: v.Name, Arguments: v.Arguments}, nil
	case "function_call_output":
		out, err := callOutput(v.Output, param+".output")
		if err != nil {
			return Item{}, err
		}
		if id == "" {
			id = "fco_" + nuid.Next()
		}
		return Item{Type: "function_call_output", ID: id, Status: StatusCompleted, CallID: v.CallID, Output: out}, nil
	case "reasoning":
		// An earlier response's reasoning, given back with its output (the
		// SDKs' agent loops do): kept with the input, not sent to the
		// engine (chat templates drop earlier turns' reasoning).
		var r struct {
			Summary []Content `json:"summary"`
			Content []Content `json:"content"`
		}
		_ = json.Unmarshal(raw, &r)
		if id == "" {
			id = "rs_" + nuid.Next()
		}
		return Item{Type: "reasoning", ID: id, Status: StatusCompleted, Summary: r.Summary, Content: r.Content}, nil
	case "item_reference":
		// An earlier response's item, by id: the gateway puts the item in
		// its place from the stored response (itemref.go).
		if v.ID == "" {
			return Item{}, schemas.ErrMissingParam.At(param+".id", param+".id")
		}
		return Item{Type: "item_reference", ID: v.ID}, nil
	}
	return Item{}, schemas.ErrResponseInput.At(param+".type", param+".type",
		"item type '"+v.Type+"' is not supported (message, function_call, function_call_output, reasoning and item_reference are)")
}

// callOutput is a function call's output as the chat tool message's
// content: a string, or the text of a list of input_text parts.
func callOutput(raw json.RawMessage, param string) (string, error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return "", schemas.ErrMissingParam.At(param, param)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", schemas.ErrInvalidType.At(param, param, "a string or an array of content parts", "another type")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "input_text" || p.Text == nil {
			return "", schemas.ErrResponseInput.At(fmt.Sprintf("%s[%d].type", param, i), fmt.Sprintf("%s[%d].type", param, i),
				"output of type '"+p.Type+"' is not supported (input_text is)")
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

func contentParts(raw json.RawMessage, role, param string) ([]Content, error) {
	textType := "input_text"
	if role == "assistant" {
		textType = "output_text"
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Content{textPart(textType, s)}, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, schemas.ErrInvalidType.At(param, param, "a string or an array of content parts", "another type")
	}
	out := make([]Content, 0, len(parts))
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			if p.Text == nil {
				return nil, schemas.ErrMissingParam.At(fmt.Sprintf("%s[%d].text", param, i), fmt.Sprintf("%s[%d].text", param, i))
			}
			out = append(out, textPart(textType, *p.Text))
		default:
			return nil, schemas.ErrResponseInput.At(fmt.Sprintf("%s[%d].type", param, i), fmt.Sprintf("%s[%d].type", param, i),
				"content of type '"+p.Type+"' is not supported (text only)")
		}
	}
	return out, nil
}

func textPart(typ, text string) Content {
	c := Content{Type: typ, Text: text}
	if typ == "output_text" {
		c.Annotations, c.Logprobs = json.RawMessage("[]"), json.RawMessage("[]")
	}
	return c
}

func text(parts []Content) string {
	if len(parts) == 1 {
		return parts[0].Text
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// chatMessage is one message of the chat API.
type chatMessage struct {
	Role       string     `json:"role"`
	Content    *string    `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// chatMessages is the conversation as chat messages: instructions as a
// system message, then the items (reasoning items are not sent).
func chatMessages(req *CreateRequest, items []Item) []chatMessage {
	var msgs []chatMessage
	if req.Instructions != nil && *req.Instructions != "" {
		s := *req.Instructions
		msgs = append(msgs, chatMessage{Role: "system", Content: &s})
	}
	for _, it := range items {
		switch it.Type {
		case "message":
			role := it.Role
			if role == "developer" {
				role = "system" // engines' chat templates know system, not always developer
			}
			s := text(it.Content)
			msgs = append(msgs, chatMessage{Role: role, Content: &s})
		case "function_call":
			tc := toolCall{ID: it.CallID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = it.Name, it.Arguments
			// Consecutive calls are one assistant turn.
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" && msgs[n-1].ToolCalls != nil {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, tc)
				continue
			}
			msgs = append(msgs, chatMessage{Role: "assistant", ToolCalls: []toolCall{tc}})
		case "function_call_output":
			s := it.Output
			msgs = append(msgs, chatMessage{Role: "tool", Content: &s, ToolCallID: it.CallID})
		}
	}
	return msgs
}

// ChatBody is the chat completions request that generates the response of
// req, whose conversation is history (the items of the responses before it,
// by previous_response_id) and input. It streams, with usage. Parse has
// checked req's values; tools and tool_choice are checked here.
func ChatBody(req *CreateRequest, history, input []Item) ([]byte, error) {
	body := map[string]any{
		"model":          req.Model,
		"messages":       chatMessages(req, append(history[:len(history):len(history)], input...)),
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	}
	if req.MaxOutputTokens != nil {
		if *req.MaxOutputTokens < 1 {
			return nil, schemas.ErrBelowMin.At("max_output_tokens", "max_output_tokens", 1, *req.MaxOutputTokens)
		}
		body["max_tokens"] = *req.MaxOutputTokens
	}
	if req.Temperature != nil {
		body["temperature"] = *req.Temperature
	}
	if req.TopP != nil {
		body["top_p"] = *req.TopP
	}
	if req.User != "" {
		body["user"] = req.User
	}
	if err := chatToolFields(req, body); err != nil {
		return nil, err
	}
	if req.Text != nil {
		f, err := readFormat(req.Text.Format)
		if err != nil {
			return nil, err
		}
		if rf := responseFormat(f); rf != nil {
			body["response_format"] = rf
		}
	}
	if r := req.Reasoning; r != nil && r.Effort != nil {
		body["reasoning_effort"] = *r.Effort
	}
	if req.Logprobs() {
		body["logprobs"] = true
		if req.TopLogprobs != nil && *req.TopLogprobs > 0 {
			body["top_logprobs"] = *req.TopLogprobs
		}
	}
	// vLLM's extras, as its own /v1/responses passes them to sampling.
	if req.TopK != nil {
		body["top_k"] = *req.TopK
	}
	if len(req.LogitBias) > 0 && string(req.LogitBias) != "null" {
		body["logit_bias"] = req.LogitBias
	}
	if req.SkipSpecialTokens != nil {
		body["skip_special_tokens"] = *req.SkipSpecialTokens
	}
	if req.Priority != nil {
		body["priority"] = *req.Priority
	}
	if req.CacheSalt != nil {
		body["cache_salt"] = *req.CacheSalt
	}
	return json.Marshal(body)
}

// responseFormat is chat's response_format for text.format: json_schema
// nests what Responses flattens; text is chat's default (nothing sent).
func responseFormat(f *textFormat) any {
	if f == nil {
		return nil
	}
	switch f.Type {
	case formatJSONObject:
		return map[string]string{"type": formatJSONObject}
	case formatJSONSchema:
		js := map[string]any{"name": *f.Name, "schema": f.Schema}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		if f.Description != nil {
			js["description"] = *f.Description
		}
		return map[string]any{"type": formatJSONSchema, "json_schema": js}
	}
	return nil
}

// chatToolFields sets the chat request's tools, tool_choice and
// parallel_tool_calls from req's.
func chatToolFields(req *CreateRequest, body map[string]any) error {
	tools, err := chatTools(req.Tools)
	if err != nil {
		return err
	}
	choice, allowed, err := chatToolChoice(req.ToolChoice, tools)
	if err != nil {
		return err
	}
	if allowed != nil {
		kept := tools[:0:0]
		for _, t := range tools {
			if slices.Contains(allowed, t.Function.Name) {
				kept = append(kept, t)
			}
		}
		tools = kept
	}
	if len(tools) == 0 {
		if choice == "none" || choice == "auto" || choice == nil {
			return nil // nothing to call: no tool fields (vLLM refuses tool_choice without tools)
		}
		return schemas.ErrResponseInput.At("tool_choice", "tool_choice", "a tool choice needs tools")
	}
	body["tools"] = tools
	if choice != nil {
		body["tool_choice"] = choice
	}
	if req.ParallelToolCalls != nil {
		body["parallel_tool_calls"] = *req.ParallelToolCalls
	}
	return nil
}

// chatTool is a chat API tool.
type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	} `json:"function"`
}

// chatTools turns Responses function tools ({type, name, description,
// parameters, strict}) into chat tools ({type, function: {...}}).
func chatTools(tools []json.RawMessage) ([]chatTool, error) {
	out := make([]chatTool, 0, len(tools))
	for i, raw := range tools {
		var t struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		param := fmt.Sprintf("tools[%d]", i)
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, schemas.ErrInvalidType.At(param, param, "an object", "another type")
		}
		if t.Type != "function" {
			return nil, schemas.ErrResponseInput.At(param+".type", param+".type", "tool type '"+t.Type+"' is not supported (function tools are)")
		}
		if t.Name == "" {
			return nil, schemas.ErrMissingParam.At(param+".name", param+".name")
		}
		var ct chatTool
		ct.Type = "function"
		ct.Function.Name, ct.Function.Description, ct.Function.Strict = t.Name, t.Description, t.Strict
		if len(t.Parameters) > 0 && string(t.Parameters) != "null" {
			ct.Function.Parameters = t.Parameters
		}
		out = append(out, ct)
	}
	return out, nil
}

// chatToolChoice is chat's tool_choice for a Responses tool_choice:
// "auto", "none" and "required" as they are, {type: function, name} in
// chat's nested form, and {type: allowed_tools, mode, tools} as mode with
// the tools narrowed to those named (allowed). nil: not set.
func chatToolChoice(raw json.RawMessage, tools []chatTool) (choice any, allowed []string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	known := func(name string) bool {
		return slices.ContainsFunc(tools, func(t chatTool) bool { return t.Function.Name == name })
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return s, nil, nil
		}
		return nil, nil, schemas.ErrResponseInput.At("tool_choice", "tool_choice", "expected auto, none, required or an object, got '"+s+"'")
	}
	var f struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Mode  string `json:"mode"`
		Tools []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, nil, schemas.ErrInvalidType.At("tool_choice", "tool_choice", "a string or an object", "another type")
	}
	switch f.Type {
	case "function":
		if f.Name == "" {
			return nil, nil, schemas.ErrMissingParam.At("tool_choice.name", "tool_choice.name")
		}
		if !known(f.Name) {
			return nil, nil, schemas.ErrResponseInput.At("tool_choice.name", "tool_choice.name", "no function tool is named '"+f.Name+"'")
		}
		return map[string]any{"type": "function", "function": map[string]string{"name": f.Name}}, nil, nil
	case "allowed_tools":
		if f.Mode != "auto" && f.Mode != "required" {
			return nil, nil, schemas.ErrResponseInput.At("tool_choice.mode", "tool_choice.mode", "expected auto or required, got '"+f.Mode+"'")
		}
		allowed = []string{}
		for i, t := range f.Tools {
			param := fmt.Sprintf("tool_choice.tools[%d]", i)
			if t.Type != "function" {
				return nil, nil, schemas.ErrResponseInput.At(param+".type", param+".type", "tool type '"+t.Type+"' is not supported (function tools are)")
			}
			if !known(t.Name) {
				return nil, nil, schemas.ErrResponseInput.At(param+".name", param+".name", "no function tool is named '"+t.Name+"'")
			}
			allowed = append(allowed, t.Name)
		}
		return f.Mode, allowed, nil
	}
	return nil, nil, schemas.ErrResponseInput.At("tool_choice.type", "tool_choice.type", "tool choice type '"+f.Type+"' is not supported (function and allowed_tools are)")
}

// continued is body continued after text (tokens of it), as the client's
// mid-stream migration does: the partial answer as a final assistant
// message with continue_final_message, and max_tokens less what is done.
// done is true when there is nothing left to generate.
func continued(body []byte, text string, tokens int) (out []byte, done bool, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, false, err
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil {
		return nil, false, err
	}
	if text != "" { // else only the budget is less (what was sent had no text: reasoning, calls)
		msg, _ := json.Marshal(chatMessage{Role: "assistant", Content: &text})
		msgs = append(msgs, msg)
		m["messages"], _ = json.Marshal(msgs)
		m["continue_final_message"] = json.RawMessage("true")
		m["add_generation_prompt"] = json.RawMessage("false")
	}
	if v, ok := m["max_tokens"]; ok {
		var limit int
		if json.Unmarshal(v, &limit) == nil {
			if limit-tokens <= 0 {
				return nil, true, nil
			}
			m["max_tokens"], _ = json.Marshal(limit - tokens)
		}
	}
	out, err = json.Marshal(m)
	return out, false, err
}
