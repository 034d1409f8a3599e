package httpengine

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// The body reaches the server byte for byte (unknown fields, number
// spelling, key order), with the request id, trace context and API key; the
// chunks reach the sink exactly as the server wrote them.
func TestStreamPassThrough(t *testing.T) {
	f, srv := startFake(t)
	f.APIKey = "sk-test"
	cfg := fastConfig(srv.URL + "/v1/") // an OpenAI base URL works too
	cfg.APIKey = "sk-test"
	e := newEngine(t, cfg)

	body := `{"model":"base","messages":[{"role":"user","content":"hi \"there\" \u00e9"}],` +
		`"stream":true,"temperature":0.7000,"my_unknown":{"a":[1,2,{"b":null}]},"x_fake":{"chunks":5}}`
	req := chat(body)
	req.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	var sink recSink
	res, err := e.Generate(t.Context(), req, &sink)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(f.Body(req.ID)); got != body {
		t.Errorf("server got body\n%s\nwant\n%s", got, body)
	}
	h := f.Header(req.ID)
	for k, want := range map[string]string{"X-Request-Id": req.ID, "Traceparent": req.TraceParent,
		"Authorization": "Bearer sk-test", "Content-Type": "application/json"} {
		if h.Get(k) != want {
			t.Errorf("header %s = %q, want %q", k, h.Get(k), want)
		}
	}
	if got, want := sink.Lines(), f.Sent(req.ID); !slices.Equal(got, want) || len(want) != 6 {
		t.Errorf("sink got\n%q\nserver sent (role and 5 chunks)\n%q", got, want)
	}
	// No usage asked for: the chunk count (the role chunk's too) stands in
	// for completion tokens.
	if res.Usage != (schemas.Usage{CompletionTokens: 6, TotalTokens: 6}) || res.Response != nil {
		t.Errorf("result %+v", res)
	}

	// A whole response comes back untouched, fields unknown to tokenbus too.
	for _, req := range []*engine.Request{chat(`{"model":"base","x_fake":{"chunks":9}}`), completion(`{"model":"base","x_fake":{"chunks":9}}`)} {
		var sink recSink
		res, err := e.Generate(t.Context(), req, &sink)
		if err != nil {
			t.Fatal(err)
		}
		if string(f.Body(req.ID)) != string(req.Body) || !strings.Contains(string(res.Response), `"x_extra":{"kept":true}`) || sink.Calls() != 0 {
			t.Errorf("%s: body changed, or response %s, or %d Chunks calls", req.Kind, res.Response, sink.Calls())
		}
	}
}

// A stream without a usage chunk (the client did not ask, and the body is
// never changed to ask) is counted by its chunks; the usage chunk, when
// asked for, is the conformance suite's (enginetest, run by vllm and openai).
func TestStreamUsage(t *testing.T) {
	_, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	for _, tc := range []struct {
		name    string
		options string
		want    schemas.Usage
	}{
		{"no usage asked: chunk count", ``, schemas.Usage{CompletionTokens: 5, TotalTokens: 5}},
		{"usage off", `"stream_options":{"include_usage":false},`, schemas.Usage{CompletionTokens: 5, TotalTokens: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true,`+tc.options+`"x_fake":{"chunks":4}}`), &recSink{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := jsonOf(res.Usage), jsonOf(tc.want); got != want {
				t.Errorf("usage %+v, want %+v", res.Usage, tc.want)
			}
		})
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Every line already buffered goes in one Chunks call; lines that arrive
// apart go apart.
func TestBatching(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))

	var burst recSink
	req := chat(`{"model":"base","stream":true,"stream_options":{"include_usage":true},"x_fake":{"mode":"burst","chunks":20}}`)
	if _, err := e.Generate(t.Context(), req, &burst); err != nil {
		t.Fatal(err)
	}
	if burst.Calls() != 1 || !slices.Equal(burst.Lines(), f.Sent(req.ID)) || len(burst.Lines()) != 22 {
		t.Errorf("burst of 22 chunks came in %d calls: %q", burst.Calls(), burst.Lines())
	}

	var paced recSink
	req = completion(`{"model":"base","stream":true,"x_fake":{"chunks":4,"delay_ms":30}}`)
	if _, err := e.Generate(t.Context(), req, &paced); err != nil {
		t.Fatal(err)
	}
	if paced.Calls() != 4 {
		t.Errorf("4 paced chunks came in %d calls: %q", paced.Calls(), paced.Lines())
	}
}

// Complete lines are handed over even when a partial line is buffered
// behind them: the reader must not wait for the rest first.
func TestNeverHoldsBack(t *testing.T) {
	pr, pw := io.Pipe()
	got := make(chan []string, 10)
	sink := sinkFunc(func(b []byte) error { got <- strings.Split(string(b), "\n"); return nil })
	done := make(chan error, 1)
	go func() {
		s := sseState{maxLine: 1 << 20}
		done <- s.run(bufio.NewReaderSize(pr, 4096), sink)
	}()
	go pw.Write([]byte("data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: {\"c\""))
	select {
	case lines := <-got:
		if !slices.Equal(lines, []string{`{"a":1}`, `{"b":2}`}) {
			t.Fatalf("first call %q", lines)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("complete lines held back while a partial one was buffered")
	}
	go pw.Write([]byte(":3,\"finish_reason\":\"stop\"}\n\ndata: [DONE]\n\n"))
	if lines := <-got; !slices.Equal(lines, []string{`{"c":3,"finish_reason":"stop"}`}) {
		t.Fatalf("second call %q", lines)
	}
	if err := <-done; err != errDone {
		t.Fatalf("run ended with %v", err)
	}
}

type sinkFunc func([]byte) error

func (f sinkFunc) Chunks(b []byte) error { return f(b) }

// SSE details: CRLF, no space after "data:", comments and other fields
// skipped, lines longer than the read buffer put together, a line over the
// limit refused; the end of a stream: clean after a finish_reason, with or
// without [DONE], truncated (engine_stream_truncated) before any.
func TestSSELines(t *testing.T) {
	long := `{"x":"` + strings.Repeat("y", 200_000) + `"}`
	const fin = `{"choices":[{"finish_reason":"stop"}]}`
	for _, tc := range []struct {
		name, in string
		want     []string
		err      string
	}{
		{"crlf", "data: {\"a\":1}\r\n\r\ndata: " + fin + "\r\n\r\ndata: [DONE]\r\n\r\n", []string{`{"a":1}`, fin}, ""},
		{"no space", "data:{\"a\":1}\n\ndata:" + fin + "\n\ndata:[DONE]\n\n", []string{`{"a":1}`, fin}, ""},
		{"others skipped", ": ping\nevent: x\nid: 3\nretry: 10\n\ndata: {\"a\":1}\n\ndata: " + fin + "\n\ndata: [DONE]\n\n", []string{`{"a":1}`, fin}, ""},
		{"long line", "data: " + long + "\n\ndata: " + fin + "\n\ndata: [DONE]\n\n", []string{long, fin}, ""},
		{"too long", "data: " + long + strings.Repeat("z", 1<<20) + "\n\n", nil, "longer than"},
		{"finish, no [DONE]: clean", "data: {\"a\":1}\n\ndata: " + fin + "\n\n", []string{`{"a":1}`, fin}, ""},
		{"finish, usage, no [DONE]: clean", "data: " + fin + "\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\n",
			[]string{fin, `{"choices":[],"usage":{"completion_tokens":1}}`}, ""},
		{"finish with spaces", "data: {\"choices\": [{\"finish_reason\" : \"length\"}]}\n\n", []string{`{"choices": [{"finish_reason" : "length"}]}`}, ""},
		{"no finish, no [DONE]", "data: {\"a\":1}\n\n", []string{`{"a":1}`}, "The engine's stream ended before it finished: the body ended after 1 chunks, before any finish_reason"},
		{"no finish, [DONE]", "data: {\"choices\":[{\"finish_reason\":null}]}\n\ndata: [DONE]\n\n", []string{`{"choices":[{"finish_reason":null}]}`},
			"The engine's stream ended before it finished: [DONE] came after 1 chunks, before any finish_reason"},
		{"empty", "", nil, "the engine answered 200 with an empty stream"},
		{"empty with [DONE]", ": hi\n\ndata: [DONE]\n\n", nil, "the engine answered 200 with an empty stream"},
		{"usage chunk without choices", "data: " + fin + "\n\ndata: {\"id\":\"x\",\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
			[]string{fin, `{"choices":[],"id":"x","usage":{"completion_tokens":1}}`}, ""},
		{"cut line", "data: {\"a\":1}\n\ndata: {\"b\"", []string{`{"a":1}`}, "unexpected EOF"},
		{"cut line after finish", "data: " + fin + "\n\ndata: {\"b\"", []string{fin}, "unexpected EOF"},
		{"finish_reason error is no error", "data: {\"choices\":[{\"finish_reason\":\"error\"}]}\n\ndata: [DONE]\n\n",
			[]string{`{"choices":[{"finish_reason":"error"}]}`}, ""},
		{"error null is no error", "data: {\"error\":null,\"finish_reason\":\"stop\"}\n\ndata: [DONE]\n\n", []string{`{"error":null,"finish_reason":"stop"}`}, ""},
		{"error object", "data: {\"a\":1}\n\ndata: {\"error\":{\"message\":\"m\",\"code\":429}}\n\n", []string{`{"a":1}`}, "429 rate_limit_error: m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sink recSink
			s := sseState{maxLine: 1 << 20, includeUsage: true}
			err := s.run(bufio.NewReaderSize(strings.NewReader(tc.in), 64<<10), &sink)
			if !slices.Equal(sink.Lines(), tc.want) {
				t.Errorf("lines %.80q, want %.80q", sink.Lines(), tc.want)
			}
			switch {
			case tc.err == "" && err != errDone:
				t.Errorf("ended with %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("ended with %v, want %q", err, tc.err)
			}
		})
	}
}

// Usage the client did not ask for is counted, not sent; usage on a chunk of
// choices (transformers serve's last chunk) becomes OpenAI's two chunks;
// with vLLM's continuous_usage_stats it goes through as sent.
func TestSSEUsage(t *testing.T) {
	const last = `{"id":"a","choices":[{"index":0,"finish_reason":"length"}],"usage":{"completion_tokens":5}}`
	const apart = `{"id":"a","choices":[],"usage":{"completion_tokens":5}}`
	const fin = `{"id":"a","choices":[{"index":0,"finish_reason":"length"}]}`
	for _, tc := range []struct {
		name          string
		in            string
		asked, asSent bool
		want          []string
	}{
		{"on the last chunk, asked", last, true, false, []string{`{"id":"a","choices":[{"index":0,"finish_reason":"length"}],"usage":null}`, apart}},
		{"on the last chunk, not asked", last, false, false, []string{`{"id":"a","choices":[{"index":0,"finish_reason":"length"}],"usage":null}`}},
		{"apart, not asked", fin + "\n\ndata: " + apart, false, false, []string{fin}},
		{"apart, asked", fin + "\n\ndata: " + apart, true, false, []string{fin, apart}},
		{"continuous_usage_stats", last, true, true, []string{last}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sink recSink
			s := sseState{maxLine: 1 << 20, includeUsage: tc.asked, usageAsSent: tc.asSent}
			err := s.run(bufio.NewReaderSize(strings.NewReader("data: "+tc.in+"\n\ndata: [DONE]\n\n"), 64<<10), &sink)
			if err != errDone || !slices.Equal(sink.Lines(), tc.want) {
				t.Fatalf("%v: lines %q, want %q", err, sink.Lines(), tc.want)
			}
			if u, est := s.usage(); est || u.CompletionTokens != 5 {
				t.Fatalf("usage %+v estimated %v: the server's count is the result's", u, est)
			}
		})
	}
}

func TestUpstreamErrorShapes(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   schemas.Error
	}{
		{"vLLM flat (before 0.10.1)", 400, `{"object":"error","message":"max_tokens too big","type":"BadRequestError","param":null,"code":400}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "max_tokens too big", Type: "invalid_request_error"}}},
		{"vLLM nested, int code", 422, `{"error":{"message":"bad temperature","type":"BadRequestError","param":"temperature","code":422}}`,
			schemas.Error{Status: 422, Body: schemas.ErrorBody{Message: "bad temperature", Type: "invalid_request_error", Param: str("temperature")}}},
		{"OpenAI nested, string code", 404, `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
			schemas.Error{Status: 404, Body: schemas.ErrorBody{Message: "The model `x` does not exist.", Type: "invalid_request_error", Param: str("model"), Code: str("model_not_found")}}},
		{"401", 401, `{"error":{"message":"Unauthorized","type":"AuthenticationError","code":401}}`,
			schemas.Error{Status: 401, Body: schemas.ErrorBody{Message: "Unauthorized", Type: "authentication_error"}}},
		{"503 overloaded", 503, `{"object":"error","message":"engine dead","type":"ServiceUnavailableError","code":503}`,
			schemas.Error{Status: 503, Body: schemas.ErrorBody{Message: "engine dead", Type: "overloaded_error"}}},
		{"500", 500, `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`,
			schemas.Error{Status: 500, Body: schemas.ErrorBody{Message: "boom", Type: "server_error"}}},
		{"TGI", 422, `{"error":"Input validation error: inputs too long","error_type":"validation"}`,
			schemas.Error{Status: 422, Body: schemas.ErrorBody{Message: "Input validation error: inputs too long", Type: "invalid_request_error"}}},
		{"FastAPI detail", 404, `{"detail":"Not Found"}`,
			schemas.Error{Status: 404, Body: schemas.ErrorBody{Message: "Not Found", Type: "invalid_request_error"}}},
		{"FastAPI validation: a 400 naming the field", 422, `{"detail":[{"loc":["body","model"],"msg":"field required"}]}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "model: field required", Type: "invalid_request_error", Param: str("model")}}},
		{"FastAPI validation, transformers serve", 422, `{"detail":[{"type":"extra_forbidden","loc":["body","ignore_eos"],"msg":"Extra inputs are not permitted","input":true}]}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "ignore_eos: Extra inputs are not permitted", Type: "invalid_request_error", Param: str("ignore_eos")}}},
		{"FastAPI validation, nested and several", 422, `{"detail":[{"loc":["body","messages",0,"content"],"msg":"bad"},{"loc":["body","n"],"msg":"too big"}]}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "messages[0].content: bad; n: too big", Type: "invalid_request_error", Param: str("messages[0].content")}}},
		{"FastAPI 422 sentence, transformers serve 5.17: a 400 naming the field", 422, `{"detail":"Unexpected fields in the request: {'ignore_eos', 'x_y'}"}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "Unexpected fields in the request: {'ignore_eos', 'x_y'}", Type: "invalid_request_error", Param: str("ignore_eos")}}},
		{"FastAPI 422 sentence: a 400", 422, `{"detail":"Server is busy"}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "Server is busy", Type: "invalid_request_error"}}},
		{"FastAPI detail list of another shape", 422, `{"detail":[1,2]}`,
			schemas.Error{Status: 422, Body: schemas.ErrorBody{Message: `[1,2]`, Type: "invalid_request_error"}}},
		{"plain-text 500: a 502 with the text", 500, "Traceback (most recent call last):\n  KeyError: 'x'\n",
			schemas.Error{Status: 502, Body: schemas.ErrorBody{Message: "the engine answered 500 Internal Server Error: Traceback (most recent call last):\n  KeyError: 'x'", Type: "server_error", Code: str("engine_error")}}},
		{"plain text", 502, "Bad Gateway\n",
			schemas.Error{Status: 502, Body: schemas.ErrorBody{Message: "Bad Gateway", Type: "server_error", Code: str("engine_error")}}},
		{"empty 500: a 502", 500, "",
			schemas.Error{Status: 502, Body: schemas.ErrorBody{Message: "the engine answered 500 Internal Server Error", Type: "server_error", Code: str("engine_error")}}},
		{"empty 400", 400, "",
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "the engine answered 400 Bad Request", Type: "invalid_request_error"}}},
		{"mid-stream, vLLM's code", 0, `{"error": {"object": "error", "message": "too long", "type": "BadRequestError", "param": null, "code": 400}}`,
			schemas.Error{Status: 400, Body: schemas.ErrorBody{Message: "too long", Type: "invalid_request_error"}}},
		{"mid-stream, no code", 0, `{"error":{"message":"oops"}}`,
			schemas.Error{Status: 502, Body: schemas.ErrorBody{Message: "oops", Type: "server_error", Code: str("engine_error")}}},
		{"odd status", 302, `{"error":{"message":"moved"}}`,
			schemas.Error{Status: 502, Body: schemas.ErrorBody{Message: "moved", Type: "server_error", Code: str("engine_error")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := UpstreamError(tc.status, []byte(tc.body))
			if string(got.JSON()) != string(tc.want.JSON()) || got.Status != tc.want.Status {
				t.Errorf("got %d %s\nwant %d %s", got.Status, got.JSON(), tc.want.Status, tc.want.JSON())
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	_, srv := startFake(t)
	url := srv.URL
	srv.Close()
	e := newEngine(t, fastConfig(url))
	_, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true}`), &recSink{})
	asError(t, err, 503, schemas.CodeEngineUnhealthy)
	unhealthy(t, e)
	asError(t, e.Health(t.Context()), 503, schemas.CodeEngineUnhealthy)
}

func TestStall(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.StallTimeout = 200 * time.Millisecond
	e := newEngine(t, cfg)
	start := time.Now()
	_, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true,"x_fake":{"mode":"slow"}}`), &recSink{})
	se := asError(t, err, 502, schemas.CodeEngineError)
	if !strings.Contains(se.Body.Message, "sent nothing for 200ms") || time.Since(start) > 3*time.Second {
		t.Errorf("after %s: %v", time.Since(start), se)
	}
	<-f.Cancelled

	cfg.ResponseTimeout = 200 * time.Millisecond
	e = newEngine(t, cfg)
	_, err = e.Generate(t.Context(), chat(`{"model":"base","x_fake":{"mode":"slow"}}`), &recSink{})
	se = asError(t, err, 502, schemas.CodeEngineError)
	if !strings.Contains(se.Body.Message, "did not answer within 200ms") {
		t.Errorf("%v", se)
	}
}

// The engine dies with a request in flight: the request ends at once with a
// clean error, Health fails, and all is well again when it comes back.
func TestEngineDeath(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	healthy(t, e)

	sink := &recSink{}
	errc := make(chan error, 1)
	go func() {
		_, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true,"x_fake":{"mode":"slow"}}`), sink)
		errc <- err
	}()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if sink.Calls() != 1 {
			return errors.New("the first chunk never came")
		}
		return nil
	})
	addr := srv.Listener.Addr().String()
	srv.CloseClientConnections()
	srv.Close()
	select {
	case err := <-errc:
		asError(t, err, 502, schemas.CodeEngineError)
	case <-time.After(5 * time.Second):
		t.Fatal("the request hung after the engine died")
	}
	unhealthy(t, e)

	serveAt(t, addr, f)
	healthy(t, e)
	if _, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true}`), &recSink{}); err != nil {
		t.Fatal(err)
	}
}

func TestHealthToggle(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.HealthPath = "/health"
	e := newEngine(t, cfg)
	healthy(t, e)
	f.SetHealthy(false)
	unhealthy(t, e)
	se := asError(t, e.Health(t.Context()), 503, schemas.CodeEngineUnhealthy)
	if !strings.Contains(se.Body.Message, "503") {
		t.Errorf("%v", se)
	}
	f.SetHealthy(true)
	healthy(t, e)
}

func TestModels(t *testing.T) {
	f, srv := startFake(t)
	f.Base = []string{"m1", "m2"}
	e := newEngine(t, fastConfig(srv.URL))
	testenv.WaitFor(t, 5*time.Second, func() error {
		if ms := e.Models(); !slices.Equal(ms, []string{"m1", "m2"}) {
			return fmt.Errorf("models %v", ms)
		}
		return nil
	})

	cfg := fastConfig(srv.URL)
	cfg.Models = []string{"static"}
	e = newEngine(t, cfg)
	healthy(t, e)
	// The list never changes: look again after ten more probes of
	// /v1/models, 100ms, two periods of the model refresh.
	probed := f.ModelsRequests()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := f.ModelsRequests() - probed; n < 10 {
			return fmt.Errorf("%d more GET /v1/models", n)
		}
		return nil
	})
	if !slices.Equal(e.Models(), []string{"static"}) {
		t.Errorf("models %v", e.Models())
	}
}

func TestURLFromCommand(t *testing.T) {
	for _, tc := range []struct{ cmd, want string }{
		{"vllm serve m --port 8001", "http://127.0.0.1:8001"},
		{"vllm serve m --host 0.0.0.0 --port=9000", "http://127.0.0.1:9000"},
		{"vllm serve m --host 10.0.0.5 --port 9000", "http://10.0.0.5:9000"},
		{"vllm serve m --host ::1 --port 9000", "http://[::1]:9000"},
		{"vllm serve m", "http://127.0.0.1:8000"},
	} {
		if got := URLFromCommand(tc.cmd, 8000); got != tc.want {
			t.Errorf("%q: %s, want %s", tc.cmd, got, tc.want)
		}
	}
	if got := URLFromCommand("llama-server -m x", 0); got != "" {
		t.Errorf("no port, no default: %q", got)
	}
}

func TestBadConfig(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8000", "ftp://x", "http://"} {
		if _, err := New("x", Config{URL: u}, Hooks{}); err == nil {
			t.Errorf("URL %q accepted", u)
		}
	}
}

// UsageOf reads the top-level usage member only, matching its key exactly;
// a repeated one is not trusted.
func TestUsageOf(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want *schemas.Usage
	}{
		{`{"id":"x","choices":[{"text":"usage"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`, &schemas.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}},
		{`{"usage":null}`, nil},
		{`{"choices":[{"usage":{"total_tokens":1}}]}`, nil}, // not top level
		{`{"Usage":{"total_tokens":2}}`, nil},
		{`{"usage":{"total_tokens":1},"usage":{"total_tokens":5}}`, nil},
		{`{"usage":{"total_tokens":"many"}}`, nil},
		{`{"usage":{"total_tokens":1}`, nil}, // truncated
		{`[]`, nil},
	} {
		got := schemas.UsageOf([]byte(tc.in))
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("%s: got %+v want %+v", tc.in, got, tc.want)
		}
	}
}

// The idle timer fires only after d without activity, however long the
// activity went on before.
func TestIdleTimer(t *testing.T) {
	const d = 150 * time.Millisecond
	fired := make(chan time.Time, 1)
	start := time.Now()
	it := newIdleTimer(d, func() { fired <- time.Now() })
	defer it.stop()
	for time.Since(start) < 4*d { // active for 4d, a touch every d/3
		select {
		case <-fired:
			t.Fatalf("fired after %s while active", time.Since(start))
		case <-time.After(d / 3):
			it.touch()
		}
	}
	quiet := time.Now()
	select {
	case at := <-fired:
		if idle := at.Sub(quiet); idle < d*2/3 || idle > 5*d {
			t.Fatalf("fired %s after the last activity, want about %s", idle, d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never fired")
	}
}

// The engine sends the model it was given, never another: a body naming
// another model is model_mismatch and reaches no server; a body naming none
// gets the model, so the server cannot run its default instead.
func TestSendsItsModel(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	req := chat(`{"model":"base-lora"}`)
	req.Model = "base"
	if _, err := e.Generate(t.Context(), req, &recSink{}); !schemas.ErrModelMismatch.Is(schemas.AsError(err)) {
		t.Fatalf("body for another model: err %v, want model_mismatch", err)
	}
	if b := f.Body(req.ID); b != nil {
		t.Fatalf("the server got %s", b)
	}
	req = chat(`{"x_fake":{"chunks":2}}`)
	req.Model = "base"
	if _, err := e.Generate(t.Context(), req, &recSink{}); err != nil {
		t.Fatal(err)
	}
	var got struct{ Model string }
	if err := json.Unmarshal(f.Body(req.ID), &got); err != nil || got.Model != "base" {
		t.Fatalf("server got %s: want model base", f.Body(req.ID))
	}
}

// The byte tests the stream reader runs on every chunk instead of decoding
// it, on the shapes servers send (whitespace anywhere JSON allows it).
func TestChunkTests(t *testing.T) {
	tests := []struct {
		chunk                      string
		errFirst, usage, finishStr bool
	}{
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`, false, false, false},
		{`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`, false, false, true},
		{`{"id":"c","choices":[],"usage":{"prompt_tokens":3}}`, false, true, false},
		{`{ "id" : "c" , "choices" : [ { "finish_reason" :	"length" } ] , "usage" : { } }`, false, true, true},
		{"{\"choices\":[{\"finish_reason\"\n:\r\n\"stop\"}],\"usage\"\t:\t{}}", false, true, true},
		{`{"error":{"message":"boom","code":500}}`, true, false, false},
		{` {  "error": "TGI's"}`, true, false, false},
		{"{\n\"error\":{}}", true, false, false},
		{`{"id":"c","error":null}`, false, false, false},
		{`{"choices":[{"delta":{"content":"\"usage\":{ and \"finish_reason\":\"x"}}]}`, false, false, false},
		{`{"choices":[{"delta":{"content":"usage\":{"}}]}`, false, false, false},
		{``, false, false, false},
		{`[`, false, false, false},
	}
	for _, tt := range tests {
		d := []byte(tt.chunk)
		if got := errorFirst(d); got != tt.errFirst {
			t.Errorf("errorFirst(%s) = %v", tt.chunk, got)
		}
		if got := hasUsage(d); got != tt.usage {
			t.Errorf("hasUsage(%s) = %v", tt.chunk, got)
		}
		if got := hasFinish(d); got != tt.finishStr {
			t.Errorf("hasFinish(%s) = %v", tt.chunk, got)
		}
	}
}

// An engine that redirects a generation is answered as an error: the
// request is not sent again elsewhere (an http.Client would follow a 307
// with the body, or turn a 302 into a GET).
func TestRedirectNotFollowed(t *testing.T) {
	var moved atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"base","object":"model"}]}`)
	})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) { moved.Add(1) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e := newEngine(t, fastConfig(srv.URL))
	_, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true}`), &recSink{})
	se := asError(t, err, http.StatusBadGateway, "")
	if !strings.Contains(se.Error(), "307") || moved.Load() != 0 {
		t.Errorf("error %v, redirect target hit %d times; want a 502 naming the 307 and no second request", se, moved.Load())
	}
}
