package simserver

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather in a city",
	"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`

// A tool-call stream over HTTP has vLLM's shape: the role, the call's id,
// type and name with empty arguments, the arguments in pieces, a chunk with
// finish_reason tool_calls, usage, [DONE].
func TestToolCallStream(t *testing.T) {
	sc := fastSim()
	sc.ReasoningTokens = 2
	ts := start(t, Config{}, sc)
	resp := do(t, "POST", ts.url+"/v1/chat/completions", `{"model":"base","stream":true,"stream_options":{"include_usage":true},
		"messages":[{"role":"user","content":"What is the weather in Oslo?"}],"tools":[`+weatherTool+`]}`)
	events := sse(t, resp)
	type delta struct {
		Role      *string `json:"role"`
		Content   *string `json:"content"`
		Reasoning *string `json:"reasoning_content"`
		ToolCalls []struct {
			Index    int             `json:"index"`
			ID       *string         `json:"id"`
			Type     *string         `json:"type"`
			Function json.RawMessage `json:"function"`
		} `json:"tool_calls"`
	}
	var kinds []string
	args := ""
	var finish string
	for _, ev := range events {
		var c struct {
			Choices []struct {
				Delta        delta   `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage != nil {
			kinds = append(kinds, "usage")
			continue
		}
		d := c.Choices[0].Delta
		switch {
		case c.Choices[0].FinishReason != nil:
			finish = *c.Choices[0].FinishReason
			kinds = append(kinds, "finish")
		case d.Role != nil:
			kinds = append(kinds, "role")
		case d.Reasoning != nil:
			kinds = append(kinds, "reasoning")
		case len(d.ToolCalls) == 1 && d.ToolCalls[0].ID != nil:
			if *d.ToolCalls[0].Type != "function" || string(d.ToolCalls[0].Function) != `{"name":"get_weather","arguments":""}` {
				t.Fatalf("call start %s", ev)
			}
			kinds = append(kinds, "call")
		case len(d.ToolCalls) == 1:
			var f map[string]string
			if err := json.Unmarshal(d.ToolCalls[0].Function, &f); err != nil || len(f) != 1 || d.ToolCalls[0].Type != nil {
				t.Fatalf("arguments delta %s", ev)
			}
			args += f["arguments"]
			if kinds[len(kinds)-1] != "args" {
				kinds = append(kinds, "args")
			}
		default:
			t.Fatalf("event %s", ev)
		}
	}
	want := "role reasoning reasoning call args finish usage"
	if strings.Join(kinds, " ") != want || finish != "tool_calls" {
		t.Fatalf("events %v (finish %q), want %s", kinds, finish, want)
	}
	var a struct{ City string }
	if err := json.Unmarshal([]byte(args), &a); err != nil || a.City == "" {
		t.Fatalf("arguments %q: %v", args, err)
	}
}

// The official Go SDK reads tool calls, streamed and not, and structured
// output, as it reads them from vLLM.
func TestOpenAIGoClientTools(t *testing.T) {
	ts := start(t, Config{}, fastSim())
	c := openai.NewClient(option.WithBaseURL(ts.url+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second))
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:    "base",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Oslo?")},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
			Name:        "get_weather",
			Description: openai.String("Weather in a city"),
			Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
				"required": []string{"city"}},
		})},
		Seed: openai.Int(5),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	ch := resp.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("%+v", ch)
	}
	st := c.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	finished := 0
	for st.Next() {
		acc.AddChunk(st.Current())
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished++
			if tc.Name != "get_weather" || tc.Arguments != ch.Message.ToolCalls[0].Function.Arguments {
				t.Errorf("finished call %+v, whole %+v", tc, ch.Message.ToolCalls[0])
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	got := acc.Choices[0].Message.ToolCalls
	if finished != 1 || len(got) != 1 || got[0].ID != ch.Message.ToolCalls[0].ID || got[0].Function.Arguments != ch.Message.ToolCalls[0].Function.Arguments {
		t.Fatalf("accumulated %+v (%d finished), whole %+v", got, finished, ch.Message.ToolCalls)
	}

	// Structured output as the SDK sends a strict schema.
	out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "base",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("A city")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{
			JSONSchema: openai.ResponseFormatJSONSchemaJSONSchemaParam{Name: "city", Strict: openai.Bool(true),
				Schema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"},
					"population": map[string]any{"type": "integer", "minimum": 1}}, "required": []string{"name", "population"},
					"additionalProperties": false}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var city struct {
		Name       string `json:"name"`
		Population int    `json:"population"`
	}
	if err := json.Unmarshal([]byte(out.Choices[0].Message.Content), &city); err != nil || city.Name == "" || city.Population < 1 {
		t.Fatalf("%q: %v", out.Choices[0].Message.Content, err)
	}
}
