package integration

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
)

// The fields of structured output, tools, logprobs and reasoning reach
// vLLM as the client sent them, through the gateway, the bus and the vllm
// engine, streamed or not (issue 36, part 2): tokenbus reads them (flow
// control, validation) and passes them on untouched.
func TestStructuredFieldsReachVLLM(t *testing.T) {
	t.Parallel()
	fake := fakevllm.New()
	srv := httptest.NewServer(fake)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	d := startDev(t, vllmEngine(srv.URL))
	c := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()

	params := openai.ChatCompletionNewParams{
		Model:    "base",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "answer", Strict: openai.Bool(true),
				Schema: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
					"required": []string{"city"}, "additionalProperties": false}}}},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Description: openai.String("The weather in a city"),
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
				"required": []string{"city"}}})},
		ToolChoice:        openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")},
		ParallelToolCalls: openai.Bool(false),
		Logprobs:          openai.Bool(true),
		TopLogprobs:       openai.Int(2),
		ReasoningEffort:   shared.ReasoningEffortLow,
	}
	sent, _ := json.Marshal(params)
	var want map[string]json.RawMessage
	if err := json.Unmarshal(sent, &want); err != nil {
		t.Fatal(err)
	}
	check := func(how string) {
		t.Helper()
		got := fake.Received()
		if len(got) == 0 {
			t.Fatalf("%s: the fake vLLM got no request", how)
		}
		var body map[string]json.RawMessage
		if err := json.Unmarshal(got[len(got)-1].Body, &body); err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		for _, k := range []string{"response_format", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "reasoning_effort", "messages"} {
			if !sameJSON(string(body[k]), string(want[k])) {
				t.Errorf("%s: %s reached vLLM as %s; sent %s", how, k, body[k], want[k])
			}
		}
	}
	if _, err := c.Chat.Completions.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	check("stream:false")
	st := c.Chat.Completions.NewStreaming(ctx, params)
	for st.Next() {
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	check("stream:true")
}

// sameJSON reports whether a and b are the same JSON value (key order aside).
func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	p, _ := json.Marshal(x)
	q, _ := json.Marshal(y)
	return string(p) == string(q)
}
