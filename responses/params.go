package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// Every field of POST /v1/responses is one of OpenAI's ResponseCreateParams
// or one of vLLM's Responses extras, and each is honoured, passed to the
// engine or refused with a 400 naming it: a field accepted and ignored
// would let a client believe it was served (docs/responses.md has the
// table). Fields that are in neither API are OpenAI's "Unknown parameter".

// readFields are the fields CreateRequest reads; check validates them.
var readFields = []string{
	"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "store", "background",
	"metadata", "previous_response_id", "tools", "tool_choice", "parallel_tool_calls", "user",
	"include", "text", "reasoning", "truncation", "top_logprobs",
	"max_tool_calls", "service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "stream_options",
	// vLLM's extras of its /v1/responses, which are chat fields too.
	"top_k", "logit_bias", "skip_special_tokens", "priority", "cache_salt",
}

// refusedFields are fields tokenbus cannot serve, with why: accepted only
// when they ask for nothing (null, false, "", [] or {}).
var refusedFields = map[string]string{
	"conversation":       "the Conversations API is not built; previous_response_id chains responses",
	"context_management": "no compaction",
	"moderation":         "no moderation model",
	"prompt":             "no stored prompt templates",
	"prompt_cache_options": "the engines' prefix caching is automatic and has no breakpoints; " +
		"tokenbus routes requests with a common prefix to the same worker",
	// In openai-go's ResponseNewParams, not (yet) in openai-python's.
	"access_programs": "no access programs",
	"image":           "image inputs are not served",
	// vLLM's extras that have no place here.
	"request_id":               "tokenbus names its requests: send X-Request-Id",
	"mm_processor_kwargs":      "image and file inputs are not served",
	"enable_response_messages": "vLLM's gpt-oss extra",
	"previous_input_messages":  "vLLM's gpt-oss extra",
}

// includes that cannot be served, with why.
var unservedIncludes = map[string]string{
	"reasoning.encrypted_content":           "reasoning items are stored with their response; chain them with previous_response_id",
	"file_search_call.results":              "no built-in tools",
	"web_search_call.results":               "no built-in tools",
	"web_search_call.action.sources":        "no built-in tools",
	"code_interpreter_call.outputs":         "no built-in tools",
	"computer_call_output.output.image_url": "no built-in tools",
	"message.input_image.image_url":         "image inputs are not served",
}

// Parse reads and checks the body of POST /v1/responses.
func Parse(body []byte) (*CreateRequest, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, schemas.ErrBodyEmpty.New()
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		if t := bytes.TrimSpace(body); len(t) > 0 && t[0] != '{' && json.Valid(t) {
			return nil, schemas.ErrBodyNotObject.New()
		}
		return nil, schemas.ErrBodyNotJSON.New(err.Error())
	}
	if fields == nil {
		return nil, schemas.ErrBodyNotObject.New()
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the same field named whatever the map's order
	for _, k := range keys {
		if why, ok := refusedFields[k]; ok {
			if !unset(fields[k]) {
				return nil, schemas.ErrResponseUnsupported.At(k, k, why)
			}
			continue
		}
		if !slices.Contains(readFields, k) {
			return nil, schemas.ErrResponseUnknownParam.At(k, k)
		}
	}
	for field, known := range nestedFields {
		if err := unknownNested(field, fields[field], known); err != nil {
			return nil, err
		}
	}
	var req CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, typeError(err)
	}
	if err := check(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// nestedFields are the members of the objects Parse reads whole, as
// OpenAI's types have them: others are unknown parameters too.
var nestedFields = map[string][]string{
	"text":           {"format", "verbosity"},
	"reasoning":      {"effort", "summary", "generate_summary", "context", "mode"},
	"stream_options": {"include_obfuscation"},
}

// unknownNested is an Unknown parameter error for the first member of
// object raw (field) that is not in known; nil for other JSON values
// (their type is checked later).
func unknownNested(field string, raw json.RawMessage, known []string) error {
	var m map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if !slices.Contains(known, k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	return schemas.ErrResponseUnknownParam.At(field+"."+keys[0], field+"."+keys[0])
}

// unset: a value that asks for nothing.
func unset(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "null", "false", `""`, "[]", "{}":
		return true
	}
	v = bytes.TrimSpace(v)
	return len(v) >= 2 && (v[0] == '[' || v[0] == '{') && len(bytes.TrimSpace(v[1:len(v)-1])) == 0
}

// typeError names the field of a JSON type error.
func typeError(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field == "" {
		return schemas.ErrBodyNotJSON.New(err.Error())
	}
	want := "another type"
	switch te.Type.Kind() {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "a boolean"
	case reflect.Int, reflect.Int64:
		want = "an integer"
	case reflect.Float64:
		want = "a number"
	case reflect.Slice:
		want = "an array"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		want = "an object"
	}
	return schemas.ErrInvalidType.At(te.Field, te.Field, want, te.Value)
}

// check validates the values tokenbus reads; tools and tool_choice are
// ChatBody's (they are translated there).
func check(r *CreateRequest) error {
	if r.Model == "" {
		return schemas.ErrNoModel.New()
	}
	if r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1 {
		return schemas.ErrBelowMin.At("max_output_tokens", "max_output_tokens", 1, *r.MaxOutputTokens)
	}
	if r.MaxToolCalls != nil && *r.MaxToolCalls < 0 {
		return schemas.ErrBelowMin.At("max_tool_calls", "max_tool_calls", 0, *r.MaxToolCalls)
	}
	if r.TopLogprobs != nil && (*r.TopLogprobs < 0 || *r.TopLogprobs > 20) {
		if *r.TopLogprobs < 0 {
			return schemas.ErrBelowMin.At("top_logprobs", "top_logprobs", 0, *r.TopLogprobs)
		}
		return schemas.ErrAboveMax.At("top_logprobs", "top_logprobs", 20, *r.TopLogprobs)
	}
	for i, v := range r.Include {
		param := fmt.Sprintf("include[%d]", i)
		if v == IncludeLogprobs {
			continue
		}
		if why, ok := unservedIncludes[v]; ok {
			return schemas.ErrResponseUnsupportedValue.At(param, "include", v, why)
		}
		return schemas.ErrResponseInput.At(param, param, "'"+v+"' is not an include value")
	}
	if r.Truncation != nil && *r.Truncation != TruncationAuto && *r.Truncation != TruncationDisabled {
		return schemas.ErrResponseInput.At("truncation", "truncation", "expected auto or disabled, got '"+*r.Truncation+"'")
	}
	if err := checkText(r.Text); err != nil {
		return err
	}
	if err := checkReasoning(r.Reasoning); err != nil {
		return err
	}
	if t := r.ServiceTier; t != nil {
		switch *t {
		case "auto", "default", "flex":
		case "priority", "fast", "ultrafast", "scale":
			return schemas.ErrResponseUnsupportedValue.At("service_tier", "service_tier", *t,
				"a request cannot raise its own band: its key's band applies; flex runs it in the batch band")
		default:
			return schemas.ErrResponseInput.At("service_tier", "service_tier", "'"+*t+"' is not a service tier")
		}
	}
	if v := r.PromptCacheRetention; v != nil && *v != "in_memory" {
		return schemas.ErrResponseUnsupportedValue.At("prompt_cache_retention", "prompt_cache_retention", *v,
			"the engines' prefix cache is in their memory, kept while it has room")
	}
	if o := r.StreamOptions; o != nil {
		if !r.Stream {
			return schemas.ErrResponseInput.At("stream_options", "stream_options", "stream_options needs stream: true")
		}
		if o.IncludeObfuscation != nil && *o.IncludeObfuscation {
			return schemas.ErrResponseUnsupportedValue.At("stream_options.include_obfuscation", "stream_options.include_obfuscation", "true",
				"delta events are not padded")
		}
	}
	return nil
}

// Text formats the chat API has a response_format for.
const (
	formatText       = "text"
	formatJSONObject = "json_object"
	formatJSONSchema = "json_schema"
)

// textFormat is text.format as tokenbus reads it: flattened, unlike chat's.
type textFormat struct {
	Type        string          `json:"type"`
	Name        *string         `json:"name"`
	Schema      json.RawMessage `json:"schema"`
	Strict      *bool           `json:"strict"`
	Description *string         `json:"description"`
}

func readFormat(raw json.RawMessage) (*textFormat, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var f textFormat
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, schemas.ErrInvalidType.At("text.format", "text.format", "an object", "another type")
	}
	return &f, nil
}

func checkText(t *TextConfig) error {
	if t == nil {
		return nil
	}
	if v := t.Verbosity; v != nil && *v != "medium" {
		return schemas.ErrResponseUnsupportedValue.At("text.verbosity", "text.verbosity", *v, "the chat API of vLLM has no verbosity; medium is what a model does by itself")
	}
	f, err := readFormat(t.Format)
	if err != nil || f == nil {
		return err
	}
	switch f.Type {
	case formatText, formatJSONObject:
	case formatJSONSchema:
		if f.Name == nil || *f.Name == "" {
			return schemas.ErrMissingParam.At("text.format.name", "text.format.name")
		}
		s := bytes.TrimSpace(f.Schema)
		if len(s) == 0 || string(s) == "null" {
			return schemas.ErrMissingParam.At("text.format.schema", "text.format.schema")
		}
		if s[0] != '{' {
			return schemas.ErrInvalidType.At("text.format.schema", "text.format.schema", "an object", "another type")
		}
	case "":
		return schemas.ErrMissingParam.At("text.format.type", "text.format.type")
	default:
		return schemas.ErrResponseInput.At("text.format.type", "text.format.type", "expected text, json_object or json_schema, got '"+f.Type+"'")
	}
	return nil
}

func checkReasoning(r *Reasoning) error {
	if r == nil {
		return nil
	}
	for _, s := range []struct {
		param string
		v     *string
	}{{"reasoning.summary", r.Summary}, {"reasoning.generate_summary", r.GenerateSummary}} {
		if s.v != nil && *s.v != "auto" {
			return schemas.ErrResponseUnsupportedValue.At(s.param, s.param, *s.v,
				"engines give their reasoning text, which is the reasoning item's content; no summary is made")
		}
	}
	if c := r.Context; c != nil && *c != "auto" && *c != "current_turn" {
		return schemas.ErrResponseUnsupportedValue.At("reasoning.context", "reasoning.context", *c,
			"earlier turns' reasoning items are not sent to the engine")
	}
	if m := r.Mode; m != nil && *m != "standard" {
		return schemas.ErrResponseUnsupportedValue.At("reasoning.mode", "reasoning.mode", *m, "one execution mode")
	}
	if e := r.Effort; e != nil && strings.TrimSpace(*e) == "" {
		return schemas.ErrResponseInput.At("reasoning.effort", "reasoning.effort", "an empty effort")
	}
	return nil
}
