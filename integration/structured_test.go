package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
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
	check := func(how string, n int) {
		t.Helper()
		got := fake.Received()
		if len(got) != n {
			t.Fatalf("%s: the fake vLLM got %d requests, want %d", how, len(got), n)
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
	check("stream:false", 1)
	st := c.Chat.Completions.NewStreaming(ctx, params)
	for st.Next() {
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	check("stream:true", 2)
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

// A stream of tool-call deltas whose worker is killed mid-arguments ends
// with a clear error, never with half an argument presented as a finished
// call (issue 36): such a stream is not migrated (client/continuation.go).
func TestToolCallStreamWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and a kill -9")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	rd := testenv.StartRedis(t)
	natsURL, httpPort := procNATS(t), testenv.FreePort(t)
	common := []string{"--nats-url", natsURL, "--redis-url", rd.URL}
	var workers []*proc
	for _, id := range []string{"w1", "w2"} { // a second worker to migrate to, were the stream migrated
		workers = append(workers, startProc(t, id, bin, append([]string{"worker", "--id", id, "--sim-decode-base", "100ms"}, common...)...))
	}
	startProc(t, "gateway", bin, append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--auth=false",
		"--admin", ""}, common...)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitReady(t, base)
	hb := watchHeartbeats(t, natsURL)

	body := `{"model":"llama-8b","stream":true,"messages":[{"role":"user","content":"Look up the weather in Paris"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{` +
		`"city":{"type":"string"},"days":{"type":"integer"},"units":{"type":"string","enum":["metric","imperial"]},` +
		`"notes":{"type":"string"}},"required":["city","days","units","notes"]}}}],"tool_choice":"required"}`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	var args strings.Builder
	pieces, killed := 0, false
	var errLine, finish string
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		if strings.HasPrefix(line, `{"error"`) {
			errLine = line
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Function struct{ Arguments string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(line), &ch) != nil || len(ch.Choices) == 0 {
			continue
		}
		for _, tc := range ch.Choices[0].Delta.ToolCalls {
			if tc.Function.Arguments != "" {
				args.WriteString(tc.Function.Arguments)
				pieces++
			}
		}
		if ch.Choices[0].FinishReason != nil {
			finish = *ch.Choices[0].FinishReason
		}
		if pieces == 2 && !killed { // mid-arguments: kill the worker streaming them
			killed = true
			victim := -1
			testenv.WaitFor(t, 2*time.Second, func() error {
				hb.mu.Lock()
				defer hb.mu.Unlock()
				for i, id := range []string{"w1", "w2"} {
					if hb.last[id].Running > 0 {
						victim = i
						return nil
					}
				}
				return fmt.Errorf("no worker says it runs the request")
			})
			workers[victim].kill9(t)
		}
	}
	if !killed {
		t.Fatalf("the stream ended before its arguments were under way: %q", args.String())
	}
	if finish != "" || errLine == "" {
		t.Fatalf("a tool call cut mid-arguments ended with finish_reason %q, error %q, arguments %q: want a clear error and no finished call",
			finish, errLine, args.String())
	}
	t.Logf("arguments cut at %q; the stream ended with %s", args.String(), errLine)
}
