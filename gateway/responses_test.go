package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// TestResponsesRefused: a field tokenbus does not serve is a 400 in
// OpenAI's shape naming it, before anything reaches a worker.
func TestResponsesRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	tests := []struct {
		body, code, param, message string
	}{
		{`"frequency_penalty":0.5`, "unknown_parameter", "frequency_penalty", "Unknown parameter: 'frequency_penalty'."},
		{`"seed":1`, "unknown_parameter", "seed", "Unknown parameter: 'seed'."},
		{`"conversation":"conv_1"`, "unsupported_parameter", "conversation", ""},
		{`"include":["reasoning.encrypted_content"]`, "unsupported_value", "include[0]", ""},
		{`"include":["message.output_text.logprobs","web_search_call.action.sources"]`, "unsupported_value", "include[1]", ""},
		{`"truncation":"sometimes"`, "invalid_value", "truncation", ""},
		{`"reasoning":{"summary":"concise"}`, "unsupported_value", "reasoning.summary", ""},
		{`"text":{"format":{"type":"json_schema","schema":{}}}`, "missing_required_parameter", "text.format.name", ""},
		{`"tools":[{"type":"web_search"}]`, "invalid_value", "tools[0].type", ""},
		{`"tool_choice":{"type":"function","name":"nope"},"tools":[{"type":"function","name":"f"}]`, "invalid_value", "tool_choice.name", ""},
	}
	for _, tt := range tests {
		resp, body := h.post(t, "/v1/responses", "application/json", `{"model":"llama-8b","input":"hi",`+tt.body+`}`, nil)
		e := openAIError(t, body)
		if resp.StatusCode != 400 || e["code"] != tt.code || e["param"] != tt.param || e["type"] != "invalid_request_error" ||
			tt.message != "" && e["message"] != tt.message {
			t.Errorf("%s: %d %s, want 400 %s naming %s", tt.body, resp.StatusCode, body, tt.code, tt.param)
		}
	}
	select {
	case m := <-h.reqs:
		t.Fatalf("a refused request reached a worker: %s", m.Data)
	default:
	}
}

// sseEvent is one named event of a Responses stream.
type sseEvent struct {
	Type string
	Data map[string]any
}

// readResponseEvents reads a Responses stream to its end: every event is
// "event: <type>" and "data: <json>" whose type is the same; no [DONE].
func readResponseEvents(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	br := bufio.NewReader(r)
	var out []sseEvent
	for {
		name, err := br.ReadString('\n')
		if err == io.EOF && name == "" {
			return out
		}
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		data, _ := br.ReadString('\n')
		blank, _ := br.ReadString('\n')
		typ, ok1 := strings.CutPrefix(strings.TrimSuffix(name, "\n"), "event: ")
		payload, ok2 := strings.CutPrefix(strings.TrimSuffix(data, "\n"), "data: ")
		if !ok1 || !ok2 || blank != "\n" {
			t.Fatalf("bad framing: %q %q %q", name, data, blank)
		}
		var ev sseEvent
		if err := json.Unmarshal([]byte(payload), &ev.Data); err != nil {
			t.Fatalf("event %q: %v", payload, err)
		}
		ev.Type = typ
		if ev.Data["type"] != typ || int(ev.Data["sequence_number"].(float64)) != len(out) {
			t.Fatalf("event %d: %q names type %v, sequence %v", len(out), typ, ev.Data["type"], ev.Data["sequence_number"])
		}
		out = append(out, ev)
	}
}

// chunksWorker answers chat requests with the chunk frames given, and
// tokenize requests with count tokens.
func chunksWorker(frames []string, count int) workerFunc {
	return func(h *harness, m *nats.Msg) {
		h.accept(m)
		if m.Header.Get(schemas.HdrKind) == string(schemas.KindTokenize) {
			h.reply(m, schemas.FrameDone, 2, fmt.Sprintf(`{"count":%d,"max_model_len":100,"tokens":[]}`, count))
			return
		}
		seq := uint64(2)
		for _, f := range frames {
			h.reply(m, schemas.FrameChunk, seq, f)
			seq++
		}
		h.reply(m, schemas.FrameDone, seq, doneChat)
	}
}

// A chat stream with reasoning, text and two tool calls whose arguments
// come in pieces.
var agentFrames = []string{
	`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
	`{"choices":[{"index":0,"delta":{"reasoning_content":"Two cities."}}]}`,
	`{"choices":[{"index":0,"delta":{"content":"Checking."}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_p","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}` + "\n" +
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_l","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Lyon\"}"}}]},"finish_reason":"tool_calls"}]}`,
	`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":20,"total_tokens":29,"completion_tokens_details":{"reasoning_tokens":3}}}`,
}

// TestResponsesStream: the events of reasoning, text and parallel tool
// calls as the engine streamed them, on httpstream (named events, no
// [DONE], the connection kept), and the chat request the worker got.
func TestResponsesStream(t *testing.T) {
	h := newHarness(t, harnessOptions{worker: chunksWorker(agentFrames, 0)})
	body := `{"model":"llama-8b","input":"weather in Paris and Lyon?","stream":true,"reasoning":{"effort":"low"},` +
		`"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}],` +
		`"tool_choice":"required","parallel_tool_calls":true,"include":["message.output_text.logprobs"],"top_logprobs":2}`
	for round := range 2 { // the second on the same connection
		reused := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if reused != (round == 1) {
			t.Fatalf("round %d: connection reused %v", round, reused)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		evs := readResponseEvents(t, resp.Body)
		resp.Body.Close()
		var types []string
		for _, e := range evs {
			types = append(types, e.Type)
		}
		want := []string{"response.created", "response.in_progress",
			"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done",
			"response.content_part.done", "response.output_item.done",
			"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.done",
			"response.content_part.done", "response.output_item.done",
			"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
			"response.output_item.added", "response.function_call_arguments.delta",
			"response.function_call_arguments.done", "response.output_item.done", "response.function_call_arguments.done", "response.output_item.done",
			"response.completed"}
		if !slices.Equal(types, want) {
			t.Fatalf("round %d events\n%s\nwant\n%s", round, strings.Join(types, "\n"), strings.Join(want, "\n"))
		}
		final := evs[len(evs)-1].Data["response"].(map[string]any)
		out := final["output"].([]any)
		if len(out) != 4 {
			t.Fatalf("output %v", out)
		}
		for i, want := range []string{`"call_p" "get_weather" "{\"city\":\"Paris\"}"`, `"call_l" "get_weather" "{\"city\":\"Lyon\"}"`} {
			c := out[2+i].(map[string]any)
			if got := fmt.Sprintf("%q %q %q", c["call_id"], c["name"], c["arguments"]); got != want || c["status"] != "completed" {
				t.Fatalf("call %d: %s, want %s", i, got, want)
			}
		}
		usage := final["usage"].(map[string]any)
		if usage["output_tokens_details"].(map[string]any)["reasoning_tokens"] != 3.0 || usage["total_tokens"] != 29.0 {
			t.Fatalf("usage %v", usage)
		}
		m := h.nextRequest(t)
		var chat map[string]json.RawMessage
		if err := json.Unmarshal(m.Data, &chat); err != nil {
			t.Fatal(err)
		}
		for k, want := range map[string]string{"reasoning_effort": `"low"`, "tool_choice": `"required"`, "parallel_tool_calls": "true",
			"logprobs": "true", "top_logprobs": "2",
			"tools": `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}]`} {
			if string(chat[k]) != want {
				t.Errorf("chat %s = %s, want %s", k, chat[k], want)
			}
		}
	}
	testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 0))
	if n := h.metric(t, "tokenbus_gateway_time_to_first_token_seconds", map[string]string{"model": testModel}); n != 2 {
		t.Fatalf("%v first-token observations, want 2", n)
	}
	if n := h.metric(t, "tokenbus_gateway_output_chunks_total", map[string]string{"model": testModel}); n != 48 {
		t.Fatalf("%v events counted, want 48", n)
	}
	testenv.WaitFor(t, 2*time.Second, h.usageIs(2))
}

// TestResponsesStructured: text.format reaches the engine as chat's
// response_format, and the response echoes it.
func TestResponsesStructured(t *testing.T) {
	h := newHarness(t, harnessOptions{worker: chunksWorker([]string{`{"choices":[{"index":0,"delta":{"content":"{\"name\":\"Ada\"}"},"finish_reason":"stop"}]}`}, 0)})
	format := `{"type":"json_schema","name":"Person","schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"],"additionalProperties":false},"strict":true}`
	resp, body := h.post(t, "/v1/responses", "application/json", `{"model":"llama-8b","input":"who?","text":{"format":`+format+`}}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var r struct {
		Text struct {
			Format json.RawMessage `json:"format"`
		} `json:"text"`
		Output []struct {
			Content []struct{ Text string } `json:"content"`
		} `json:"output"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || string(r.Text.Format) != format || r.Output[0].Content[0].Text != `{"name":"Ada"}` {
		t.Fatalf("response %s", body)
	}
	var chat struct {
		ResponseFormat json.RawMessage `json:"response_format"`
	}
	_ = json.Unmarshal(h.nextRequest(t).Data, &chat)
	want := `{"json_schema":{"name":"Person","schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"],"additionalProperties":false},"strict":true},"type":"json_schema"}`
	if string(chat.ResponseFormat) != want {
		t.Fatalf("response_format %s\nwant %s", chat.ResponseFormat, want)
	}
}

// TestResponsesContextWindow: with max_model_len known, a conversation
// that does not fit is refused (truncation disabled) or has its oldest
// items dropped (auto), counted by a tokenize request on the bus.
func TestResponsesContextWindow(t *testing.T) {
	h := newHarness(t, harnessOptions{worker: chunksWorker([]string{chatHello}, 150)})
	h.cat.mu.Lock()
	h.cat.maxLen = 100
	h.cat.mu.Unlock()
	input := `[{"role":"user","content":"` + strings.Repeat("old ", 40) + `"},{"role":"assistant","content":"ok"},{"role":"user","content":"now?"}]`

	resp, body := h.post(t, "/v1/responses", "application/json", `{"model":"llama-8b","instructions":"be brief","input":`+input+`}`, nil)
	if e := openAIError(t, body); resp.StatusCode != 400 || e["code"] != "context_length_exceeded" || e["param"] != "input" {
		t.Fatalf("disabled: %d %s", resp.StatusCode, body)
	}
	if m := h.nextRequest(t); m.Header.Get(schemas.HdrKind) != string(schemas.KindTokenize) {
		t.Fatalf("a %s request, want tokenize", m.Header.Get(schemas.HdrKind))
	}

	// auto: the worker's tokenizer says 150 whatever is sent, so tokenbus
	// drops all it may, keeping the instructions and the last turn.
	resp, body = h.post(t, "/v1/responses", "application/json", `{"model":"llama-8b","instructions":"be brief","truncation":"auto","input":`+input+`}`, nil)
	if resp.StatusCode != 400 {
		t.Fatalf("auto, nothing fits: %d %s", resp.StatusCode, body)
	}
	for range 2 { // the first count, and the count after dropping
		if m := h.nextRequest(t); m.Header.Get(schemas.HdrKind) != string(schemas.KindTokenize) {
			t.Fatalf("a %s request, want tokenize", m.Header.Get(schemas.HdrKind))
		}
	}
}

// TestResponsesTruncated: truncation auto drops the oldest items until
// the count fits; the engine gets the rest.
func TestResponsesTruncated(t *testing.T) {
	counts := make(chan int, 10)
	counts <- 150
	counts <- 60
	h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
		if m.Header.Get(schemas.HdrKind) == string(schemas.KindTokenize) {
			h.accept(m)
			h.reply(m, schemas.FrameDone, 2, fmt.Sprintf(`{"count":%d}`, <-counts))
			return
		}
		chunksWorker([]string{chatHello}, 0)(h, m)
	}})
	h.cat.mu.Lock()
	h.cat.maxLen = 100
	h.cat.mu.Unlock()
	input := `[{"role":"user","content":"` + strings.Repeat("old ", 40) + `"},{"role":"assistant","content":"ok"},{"role":"user","content":"now?"}]`
	resp, body := h.post(t, "/v1/responses", "application/json", `{"model":"llama-8b","instructions":"be brief","truncation":"auto","input":`+input+`}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `"truncation":"auto"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var chat struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	for {
		m := h.nextRequest(t)
		if m.Header.Get(schemas.HdrKind) == string(schemas.KindChat) {
			_ = json.Unmarshal(m.Data, &chat)
			break
		}
	}
	var got []string
	for _, m := range chat.Messages {
		got = append(got, m.Role+":"+m.Content)
	}
	if want := []string{"system:be brief", "user:now?"}; !slices.Equal(got, want) { // a whole turn goes
		t.Fatalf("messages %q, want %q", got, want)
	}
}

// TestResponsesClientGone: a client that leaves a response, streamed or
// not, cancels its request at the worker (the watcher notices the silent
// one), and counts as a disconnect.
func TestResponsesClientGone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  bool
		readOne bool
	}{{"stream:false, silent", false, false}, {"mid-stream", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
				h.accept(m)
				if tc.readOne {
					h.reply(m, schemas.FrameChunk, 2, chatHello) // then silence
				}
			}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/responses",
				strings.NewReader(fmt.Sprintf(`{"model":"llama-8b","input":"hi","stream":%v}`, tc.stream)))
			req.Header.Set("Content-Type", "application/json")
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := h.http.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				if tc.readOne {
					line, err := bufio.NewReader(resp.Body).ReadString('\n')
					if err != nil || line != "event: response.created\n" {
						t.Errorf("first line %q, %v", line, err)
					}
					cancel()
				}
			}()
			m := h.nextRequest(t)
			if !tc.readOne {
				cancel()
			}
			<-done
			for {
				c := h.nextCancel(t)
				if string(c.Data) == string(schemas.CancelBody(m.Header.Get(schemas.HdrRequestID), m.Header.Get(schemas.HdrCancelToken))) &&
					c.Subject == schemas.CancelSubject(fakeWorker) {
					break
				}
			}
			testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_client_disconnects_total", 1))
			testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 0))
		})
	}
}
