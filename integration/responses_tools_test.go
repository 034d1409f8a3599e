package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/program"
)

// scriptedVLLM is the fake vLLM with its chat completions scripted as a
// reasoning model with a tool parser would answer (the sim makes neither
// tool calls nor JSON): every chat request's body is kept, and answered
// with chunks chosen by what it asks:
//   - response_format: the JSON of a person;
//   - a last message from a tool: text, with logprobs when asked;
//   - tools: reasoning_content, then two parallel get_weather calls whose
//     arguments come in pieces.
//
// Everything else (models, health, metrics) is the fake's.
type scriptedVLLM struct {
	fake *fakevllm.Server
	mu   sync.Mutex
	chat []map[string]json.RawMessage
}

func (s *scriptedVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		s.fake.ServeHTTP(w, r)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	s.mu.Lock()
	s.chat = append(s.chat, body)
	s.mu.Unlock()
	var msgs []struct{ Role string }
	_ = json.Unmarshal(body["messages"], &msgs)
	delta := func(d string) string {
		return `{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":` + d + `,"logprobs":null,"finish_reason":null}]}`
	}
	chunks := []string{delta(`{"role":"assistant","content":""}`)}
	finish := "stop"
	switch {
	case body["response_format"] != nil:
		chunks = append(chunks, delta(`{"content":"{\"name\":\"Ada\","}`), delta(`{"content":"\"age\":36}"}`))
	case len(msgs) > 0 && msgs[len(msgs)-1].Role == "tool":
		for _, tok := range []string{"Paris 20C", ", Lyon 18C"} {
			lp := "null"
			if string(body["logprobs"]) == "true" {
				lp = fmt.Sprintf(`{"content":[{"token":%q,"logprob":-0.25,"bytes":null,"top_logprobs":[{"token":%q,"logprob":-0.25,"bytes":null}]}]}`, tok, tok)
			}
			chunks = append(chunks, `{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{"content":`+
				fmt.Sprintf("%q", tok)+`},"logprobs":`+lp+`,"finish_reason":null}]}`)
		}
	default:
		finish = "tool_calls"
		chunks = append(chunks, delta(`{"reasoning_content":"Two cities: "}`), delta(`{"reasoning_content":"two calls."}`),
			delta(`{"tool_calls":[{"index":0,"id":"call_paris","type":"function","function":{"name":"get_weather","arguments":""}}]}`),
			delta(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]}`),
			delta(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`),
			delta(`{"tool_calls":[{"index":1,"id":"call_lyon","type":"function","function":{"name":"get_weather","arguments":""}}]}`),
			delta(`{"tool_calls":[{"index":1,"function":{"arguments":"{\"city\": \"Lyon\"}"}}]}`))
	}
	chunks = append(chunks, `{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"`+finish+`"}]}`,
		`{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":30,"completion_tokens_details":{"reasoning_tokens":4}}}`)
	w.Header().Set("Content-Type", "text/event-stream")
	for _, c := range chunks {
		fmt.Fprintf(w, "data: %s\n\n", c)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// lastChat is the last chat request the engine got.
func (s *scriptedVLLM) lastChat(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.chat) == 0 {
		t.Fatal("the engine got no chat request")
	}
	return s.chat[len(s.chat)-1]
}

// TestResponsesTools is issue 36's round trip with openai-go's Responses
// client, against tokenbus dev in front of a (scripted) vLLM: a streamed
// turn with reasoning and two parallel function calls whose arguments
// stream in pieces, the agent's next turn with the calls' outputs (by
// previous_response_id) answered with text and its logprobs, and a
// structured output. The engine gets what was asked, as chat fields.
func TestResponsesTools(t *testing.T) {
	t.Parallel()
	f := fakevllm.New()
	f.Base = []string{"llama-8b"}
	f.SetMetrics("")
	eng := &scriptedVLLM{fake: f}
	srv := httptest.NewServer(eng)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	d := startDev(t, vllmEngine(srv.URL))
	c := openaiClient(d.URL + "/v1")
	ctx := context.Background()
	// The Python SDK's helpers too: parse(text_format=...), the stream
	// helper's function calls, every event checked against its types.
	t.Run("python", func(t *testing.T) {
		runSDK(t, "TOKENBUS_TEST_PYTHON", "python responses tools ok", "clients/python_responses_tools.py", d.URL)
	})

	weather := responses.ToolParamOfFunction("get_weather", map[string]any{"type": "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}, "additionalProperties": false}, true)
	stream := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model:             "llama-8b",
		Input:             responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather in Paris and Lyon?")},
		Tools:             []responses.ToolUnionParam{weather},
		ToolChoice:        responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsRequired)},
		ParallelToolCalls: openai.Bool(true),
		Reasoning:         shared.ReasoningParam{Effort: shared.ReasoningEffortLow},
	})
	var types []string
	args := map[int64]string{} // built from the deltas, as a client does
	argDeltas := 0
	var first responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.function_call_arguments.delta":
			args[ev.OutputIndex] += ev.Delta
			argDeltas++
		case "response.completed":
			first = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v (events %v)", err, types)
	}
	if argDeltas != 3 || args[1] != `{"city": "Paris"}` || args[2] != `{"city": "Lyon"}` {
		t.Fatalf("%d argument deltas, arguments %v (events %v)", argDeltas, args, types)
	}
	for _, want := range []string{"response.reasoning_text.delta", "response.reasoning_text.done", "response.function_call_arguments.done"} {
		if !slices.Contains(types, want) {
			t.Fatalf("no %s in %v", want, types)
		}
	}
	if first.Status != "completed" || len(first.Output) != 3 {
		t.Fatalf("response %s %+v", first.Status, first.Output)
	}
	rs := first.Output[0].AsReasoning()
	if first.Output[0].Type != "reasoning" || len(rs.Content) != 1 || rs.Content[0].Text != "Two cities: two calls." {
		t.Fatalf("reasoning item %s", first.Output[0].RawJSON())
	}
	var callIDs []string
	for i, city := range []string{"Paris", "Lyon"} {
		fc := first.Output[1+i].AsFunctionCall()
		if fc.Name != "get_weather" || fc.Arguments != `{"city": "`+city+`"}` || fc.Status != "completed" || !strings.HasPrefix(fc.ID, "fc_") {
			t.Fatalf("call %d: %s", i, first.Output[1+i].RawJSON())
		}
		callIDs = append(callIDs, fc.CallID)
	}
	if !slices.Equal(callIDs, []string{"call_paris", "call_lyon"}) || first.Usage.OutputTokensDetails.ReasoningTokens != 4 {
		t.Fatalf("call ids %v, usage %+v", callIDs, first.Usage)
	}
	chat := eng.lastChat(t)
	for k, want := range map[string]string{
		"tools":       `[{"type":"function","function":{"name":"get_weather","parameters":{"additionalProperties":false,"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"},"strict":true}}]`,
		"tool_choice": `"required"`, "parallel_tool_calls": "true", "reasoning_effort": `"low"`} {
		if got := string(chat[k]); got != want {
			t.Errorf("the engine got %s %s, want %s", k, got, want)
		}
	}

	// The agent's next turn: the calls' outputs, after the first response.
	second, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model:              "llama-8b",
		PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			callOutput(callIDs[0], "20C"), callOutput(callIDs[1], "18C"),
		}},
		Tools:       []responses.ToolUnionParam{weather},
		Include:     []responses.ResponseIncludable{responses.ResponseIncludableMessageOutputTextLogprobs},
		TopLogprobs: openai.Int(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if second.OutputText() != "Paris 20C, Lyon 18C" {
		t.Fatalf("second turn %q: %s", second.OutputText(), second.RawJSON())
	}
	lps := second.Output[0].AsMessage().Content[0].Logprobs
	if len(lps) != 2 || lps[0].Token != "Paris 20C" || lps[0].Logprob != -0.25 || len(lps[0].Bytes) != len("Paris 20C") || len(lps[0].TopLogprobs) != 1 {
		t.Fatalf("logprobs %+v", lps)
	}
	chat = eng.lastChat(t)
	var msgs []struct {
		Role       string
		Content    *string
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(chat["messages"], &msgs); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range msgs {
		roles = append(roles, m.Role)
	}
	if !slices.Equal(roles, []string{"user", "assistant", "tool", "tool"}) || len(msgs[1].ToolCalls) != 2 ||
		msgs[1].ToolCalls[1].ID != "call_lyon" || msgs[1].ToolCalls[1].Function.Arguments != `{"city": "Lyon"}` ||
		msgs[2].ToolCallID != "call_paris" || *msgs[2].Content != "20C" || msgs[3].ToolCallID != "call_lyon" {
		t.Fatalf("the engine got messages %s", chat["messages"])
	}
	if string(chat["logprobs"]) != "true" || string(chat["top_logprobs"]) != "1" {
		t.Fatalf("the engine got logprobs %s top_logprobs %s", chat["logprobs"], chat["top_logprobs"])
	}

	// Structured output: the schema reaches the engine as chat's
	// response_format, and the text is the JSON.
	schema := map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"},
		"age": map[string]any{"type": "integer"}}, "required": []string{"name", "age"}, "additionalProperties": false}
	third, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "llama-8b",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Who wrote the first program?")},
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
			OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "person", Schema: schema, Strict: openai.Bool(true)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var person struct {
		Name string
		Age  int
	}
	if err := json.Unmarshal([]byte(third.OutputText()), &person); err != nil || person.Name != "Ada" || person.Age != 36 {
		t.Fatalf("output %q: %v", third.OutputText(), err)
	}
	if third.Text.Format.Type != "json_schema" || third.Text.Format.Name != "person" {
		t.Fatalf("text echoed %s", third.Text.RawJSON())
	}
	var rf struct {
		Type       string
		JSONSchema struct {
			Name   string
			Strict bool
			Schema map[string]any
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(eng.lastChat(t)["response_format"], &rf); err != nil || rf.Type != "json_schema" ||
		rf.JSONSchema.Name != "person" || !rf.JSONSchema.Strict || rf.JSONSchema.Schema["required"] == nil {
		t.Fatalf("the engine got response_format %s", eng.lastChat(t)["response_format"])
	}
}

// callOutput is a function_call_output input item.
func callOutput(callID, output string) responses.ResponseInputItemUnionParam {
	it := responses.ResponseInputItemParamOfFunctionCallOutput(output)
	it.OfFunctionCallOutput.CallID = openai.String(callID)
	return it
}

// TestResponsesTruncation: the sim's context (its max_model_len, which the
// gateway learns from the worker's heartbeats) bounds a conversation: over
// it, truncation "disabled" is a 400 context_length_exceeded, "auto" drops
// the oldest turns until the sim's own tokenizer, asked over the bus, says
// the rest fits.
func TestResponsesTruncation(t *testing.T) {
	t.Parallel()
	d := startDev(t, func(c *program.DevConfig) { c.Engine.Sim.MaxModelLen = 400 })
	var turns []string
	for i := range 6 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		turns = append(turns, fmt.Sprintf(`{"role":%q,"content":%q}`, role, fmt.Sprintf("turn %d: ", i)+strings.Repeat("the quick brown fox jumps over the lazy dog ", 8)))
	}
	turns = append(turns, `{"role":"user","content":"and now?"}`)
	input := "[" + strings.Join(turns, ",") + "]"

	r := post(t, d.URL, "/v1/responses", `{"model":"llama-8b","max_output_tokens":16,"input":`+input+`}`)
	if e := errorBody(t, r.Body); r.Status != 400 || e.Code == nil || *e.Code != "context_length_exceeded" || e.Param == nil || *e.Param != "input" {
		t.Fatalf("disabled: %d %s", r.Status, r.Body)
	}
	r = post(t, d.URL, "/v1/responses", `{"model":"llama-8b","max_output_tokens":16,"truncation":"auto","instructions":"be brief","input":`+input+`}`)
	var resp struct {
		ID, Status, Truncation string
		Usage                  struct {
			InputTokens int `json:"input_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(r.Body), &resp); r.Status != 200 || err != nil || resp.Truncation != "auto" {
		t.Fatalf("auto: %d %s", r.Status, r.Body)
	}
	// A message is about 80 tokens: the whole is over 400, one turn (two
	// messages) less fits, two less would be about 190 (dropped too many).
	if resp.Usage.InputTokens+16 > 400 || resp.Usage.InputTokens < 300 {
		t.Fatalf("auto: %d input tokens for a 400-token context: %s", resp.Usage.InputTokens, r.Body)
	}
	var items struct{ Data []json.RawMessage }
	if st, raw, err := httpJSON("GET", d.URL+"/v1/responses/"+resp.ID+"/input_items?limit=100", "", nil, &items); st != 200 || err != nil || len(items.Data) != 7 {
		t.Fatalf("input items: %d %v %s (the stored input is the whole input)", st, err, raw)
	}
}
