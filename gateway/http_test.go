package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// The SSE body is exactly "data: " + each chunk line the worker sent, then
// [DONE], and the body ends there.
func TestSSEBytes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, tc := range []struct {
		path, body string
		frames     []string
	}{
		{"/v1/chat/completions", chatBody, chatFrames},
		{"/v1/completions", promptBody, cmplFrames},
		{"/predictions/llama-8b/1.0/v1/chat/completions", chatBody, chatFrames},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, body := h.post(t, tc.path, "application/json", tc.body, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if want := standardSSE(tc.frames); body != want {
				t.Fatalf("SSE body\n got %q\nwant %q", body, want)
			}
			for k, v := range map[string]string{
				"Content-Type":      "text/event-stream",
				"Cache-Control":     "no-cache",
				"X-Accel-Buffering": "no",
			} {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			if resp.Header.Get("Content-Length") != "" || resp.ContentLength != -1 {
				t.Errorf("a stream must not have a Content-Length")
			}
			h.nextRequest(t)
		})
	}
	testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 0))
	if got := h.metric(t, "tokenbus_gateway_output_chunks_total", nil); got != 5+3+5 {
		t.Fatalf("output chunks %v", got)
	}
}

// Non-stream responses are the done payload as is.
func TestUnaryBytes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	resp, body := h.post(t, "/v1/chat/completions", "application/json", unaryBody, nil)
	if resp.StatusCode != 200 || body != chatFull || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

func TestRequestErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{BodyLimit: 4096}})
	big := `{"model":"llama-8b","messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`
	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		param                           any // nil: JSON null
		code                            any
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", "application/json", `{"model":`, 400, nil, nil},
		{"not an object", "POST", "/v1/chat/completions", "application/json", `[1,2]`, 400, nil, nil},
		{"empty body", "POST", "/v1/chat/completions", "application/json", ``, 400, nil, nil},
		{"stream not a bool", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"stream":"yes"}`, 400, "stream", "invalid_type"},
		{"n not an int", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"n":"2"}`, 400, "n", "invalid_type"},
		{"n zero", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"n":0}`, 400, "n", "integer_below_min_value"},
		{"include_usage not a bool", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":1}}`, 400, "stream_options.include_usage", "invalid_type"},
		{"stream_options without stream", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, 400, "stream_options", "invalid_value"},
		{"model missing", "POST", "/v1/chat/completions", "application/json", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "missing_required_parameter"},
		{"model null", "POST", "/predictions/llama-8b/1.0/v1/chat/completions", "application/json", `{"model":null,"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "missing_required_parameter"},
		{"model not a string", "POST", "/v1/chat/completions", "application/json", `{"model":7,"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "invalid_type"},
		{"messages missing", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b"}`, 400, "messages", "missing_required_parameter"},
		{"messages empty", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[]}`, 400, "messages", "empty_array"},
		{"messages not an array", "POST", "/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":"hi"}`, 400, "messages", "invalid_type"},
		{"prompt missing", "POST", "/v1/completions", "application/json", `{"model":"llama-8b"}`, 400, "prompt", "missing_required_parameter"},
		{"prompt not a string or array", "POST", "/v1/completions", "application/json", `{"model":"llama-8b","prompt":{"a":1}}`, 400, "prompt", "invalid_type"},
		{"unknown model", "POST", "/v1/chat/completions", "application/json", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404, "model", "model_not_found"},
		{"unknown model, torchserve path", "POST", "/predictions/gpt-9/1.0/v1/completions", "application/json", `{"prompt":"hi"}`, 404, "model", "model_not_found"},
		{"torchserve path and body name two models", "POST", "/predictions/other/1.0/v1/chat/completions", "application/json", `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}]}`, 400, "model", "model_mismatch"},
		{"text/plain", "POST", "/v1/chat/completions", "text/plain", unaryBody, 415, nil, "unsupported_media_type"},
		{"no content type", "POST", "/v1/chat/completions", "", unaryBody, 415, nil, "unsupported_media_type"},
		{"body over limit", "POST", "/v1/chat/completions", "application/json", big, 413, nil, "request_too_large"},
		{"unknown route", "POST", "/v1/audio/speech", "application/json", unaryBody, 404, nil, "unknown_url"},
		{"unknown route GET", "GET", "/nope", "", "", 404, nil, "unknown_url"},
		{"wrong method", "GET", "/v1/chat/completions", "", "", 405, nil, "method_not_allowed"},
		{"wrong method on models", "DELETE", "/v1/models", "", "", 405, nil, "method_not_allowed"},
		{"unknown model id", "GET", "/v1/models/nope/nope", "", "", 404, "model", "model_not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, h.base+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			resp, body := h.do(t, req)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Fatal("no X-Request-Id on an error")
			}
			e := openAIError(t, body)
			if e["param"] != tc.param || e["code"] != tc.code {
				t.Fatalf("param %v code %v, want %v %v: %s", e["param"], e["code"], tc.param, tc.code, body)
			}
			if e["message"] == "" || e["type"] == "" {
				t.Fatalf("empty message or type: %s", body)
			}
		})
	}
	select {
	case m := <-h.reqs:
		t.Fatalf("a rejected request reached the bus: %s", m.Data)
	default:
	}
	if got := h.metric(t, "tokenbus_gateway_requests_total",
		map[string]string{"route": "/v1/chat/completions", "model": "unknown", "status": "404"}); got != 1 {
		t.Fatalf("requests_total for the unknown model: %v", got)
	}
}

// Errors from the bus before the first chunk keep their status, Retry-After
// and body, for streams and not.
func TestErrorBeforeFirstChunk(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    *schemas.Error
		seq    uint64
		accept bool
		retry  string
	}{
		{"queue full", schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeQueueFull, "", "the queue is full").WithRetryAfter(7), 0, false, "7"},
		{"no worker", schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeNoWorker, "", "no worker serves llama-8b").WithRetryAfter(2), 0, false, "2"},
		{"engine 400", schemas.FromUpstream(400, schemas.TypeInvalidRequest, "", "max_tokens", "This model's maximum context length is 8192 tokens."), 2, true, ""},
		{"not found", schemas.ErrModelNotFound.New("llama-8b"), 0, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
				if tc.accept {
					h.accept(m)
				}
				h.reply(m, schemas.FrameError, tc.seq, string(tc.err.Payload()))
			}})
			for _, body := range []string{chatBody, unaryBody} {
				resp, got := h.post(t, "/v1/chat/completions", "application/json", body, nil)
				if resp.StatusCode != tc.err.Status || resp.Header.Get("Retry-After") != tc.retry {
					t.Fatalf("status %d Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), got)
				}
				if got != string(tc.err.JSON()) {
					t.Fatalf("body %s, want %s", got, tc.err.JSON())
				}
			}
		})
	}
}

// With nobody subscribed, NATS answers "no responders": a 503 at once.
func TestNoResponders(t *testing.T) {
	h := newHarness(t, harnessOptions{noWorker: true})
	for _, body := range []string{chatBody, unaryBody} {
		start := time.Now()
		resp, got := h.post(t, "/v1/chat/completions", "application/json", body, nil)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
		if e := openAIError(t, got); e["code"] != schemas.CodeNoDispatcher {
			t.Fatalf("code %v", e["code"])
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("no responders took %s", d)
		}
	}
}

// An error after the first chunk goes in-band, then [DONE]. The request
// counts as a 200 (that status went out with the first chunk), and
// tokenbus_gateway_stream_errors_total counts it by code: a code of the
// catalogue as it is, an engine's own as "upstream".
func TestErrorAfterFirstChunk(t *testing.T) {
	for _, tc := range []struct {
		err  *schemas.Error
		code string
	}{
		{schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeStreamLost, "", "worker fake-1 went silent").WithRetryAfter(1), "stream_lost"},
		{schemas.FromUpstream(500, "server_error", "cuda_oom_42", "", "the engine ran out of memory"), "upstream"},
	} {
		h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
			h.accept(m)
			h.reply(m, schemas.FrameChunk, 2, chatRole)
			h.reply(m, schemas.FrameError, 3, string(tc.err.Payload()))
		}})
		resp, body := h.post(t, "/v1/chat/completions", "application/json", chatBody, nil)
		want := "data: " + chatRole + "\n\ndata: " + string(tc.err.JSON()) + "\n\ndata: [DONE]\n\n"
		if resp.StatusCode != 200 || body != want {
			t.Fatalf("status %d body\n got %q\nwant %q", resp.StatusCode, body, want)
		}
		if len(h.usageCalls()) != 0 {
			t.Fatal("OnUsage called for a failed request")
		}
		testenv.WaitFor(t, 2*time.Second, func() error {
			if n := h.metric(t, "tokenbus_gateway_stream_errors_total", map[string]string{"code": tc.code}); n != 1 {
				return fmt.Errorf("stream errors with code %s: %v, want 1", tc.code, n)
			}
			if n := h.metric(t, "tokenbus_gateway_requests_total", map[string]string{"status": "200"}); n != 1 {
				return fmt.Errorf("requests with status 200: %v, want 1", n)
			}
			return nil
		})
	}
}

// A sequence gap (a lost message) must end the stream with an error, never
// with silently missing text.
func TestSequenceGap(t *testing.T) {
	h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
		h.accept(m)
		h.reply(m, schemas.FrameChunk, 2, chatRole)
		h.reply(m, schemas.FrameChunk, 4, chatHello) // 3 is missing
		h.reply(m, schemas.FrameDone, 5, doneChat)
	}})
	_, body := h.post(t, "/v1/chat/completions", "application/json", chatBody, nil)
	if !strings.Contains(body, `"code":"stream_lost"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") ||
		strings.Contains(body, "Hello") {
		t.Fatalf("body %q", body)
	}
}

func TestRequestID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, tc := range []struct {
		name, given string
		keep        bool
	}{
		{"valid is kept", "my-trace_1.2:3", true},
		{"invalid is replaced", "bad id with spaces", false},
		{"too long is replaced", strings.Repeat("a", schemas.MaxRequestIDLen+1), false},
		{"absent is generated", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, body := range []string{chatBody, unaryBody} {
				hdr := map[string]string{}
				if tc.given != "" {
					hdr["X-Request-Id"] = tc.given
				}
				resp, _ := h.post(t, "/v1/chat/completions", "application/json", body, hdr)
				id := resp.Header.Get("X-Request-Id")
				switch {
				case tc.keep && id != tc.given:
					t.Fatalf("X-Request-Id %q, want %q", id, tc.given)
				case !tc.keep && (!strings.HasPrefix(id, "req-") || !schemas.ValidRequestID(id)):
					t.Fatalf("generated X-Request-Id %q", id)
				}
				if got := h.nextRequest(t).Header.Get(schemas.HdrRequestID); got != id {
					t.Fatalf("Tb-Request-Id %q, want %q", got, id)
				}
			}
		})
	}
	resp, _ := h.get(t, "/health")
	if !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req-") {
		t.Fatal("no X-Request-Id on /health")
	}
}

// The body reaches the worker byte for byte: unknown fields, odd spacing,
// key order. Only the TorchServe form without a model in the body gets one.
func TestBodyPassThrough(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	odd := "{ \"messages\" : [{\"role\":\"user\",\"content\":\"h\\u00e9\"}],\n\t\"x_unknown\": {\"a\":[1,2.50,null]}, \"top_k\":5, \"model\":\"llama-8b\",\"guided_json\":{} }"
	for _, tc := range []struct {
		name, path, body, want, wantModel string
	}{
		{"v1", "/v1/chat/completions", odd, odd, testModel},
		{"torchserve with model", "/predictions/llama-8b/1.0/v1/chat/completions", odd, odd, testModel},
		{"torchserve without model", "/predictions/llama-8b/1.0/v1/completions",
			` {"prompt":"hi", "weird": true}`, ` {"model":"llama-8b","prompt":"hi", "weird": true}`, testModel},
		{"torchserve escaped slashed model", "/predictions/meta-llama%2FLlama-3.1-8B/1.0/v1/completions",
			`{"prompt":[1,2]}`, `{"model":"meta-llama/Llama-3.1-8B","prompt":[1,2]}`, testSlashedModel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := h.post(t, tc.path, "application/json; charset=utf-8", tc.body, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			m := h.nextRequest(t)
			if string(m.Data) != tc.want {
				t.Fatalf("worker got\n%q\nwant\n%q", m.Data, tc.want)
			}
			if m.Header.Get(schemas.HdrModel) != tc.wantModel {
				t.Fatalf("Tb-Model %q", m.Header.Get(schemas.HdrModel))
			}
			if m.Subject != schemas.ReqSubject(tc.wantModel) {
				t.Fatalf("subject %q", m.Subject)
			}
			if dl := schemas.ParseDeadline(m.Header.Get(schemas.HdrDeadline)); time.Until(dl) < 9*time.Minute {
				t.Fatalf("deadline %v", dl)
			}
		})
	}
}

// A client that hangs up mid-stream or while its request is queued gets its
// request cancelled: at the worker once accepted, in the queues before.
func TestClientHangUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		worker  workerFunc
		readOne bool   // read the first event before hanging up
		subject string // where the cancel must go
	}{
		{"mid-stream", chatBody, func(h *harness, m *nats.Msg) {
			h.accept(m)
			h.reply(m, schemas.FrameChunk, 2, chatRole) // then silence
		}, true, schemas.CancelSubject(fakeWorker)},
		{"queued, stream", chatBody, func(h *harness, m *nats.Msg) {
			h.reply(m, schemas.FrameQueued, 0, `{"position":3,"timeout_ms":60000}`)
		}, false, schemas.QueueCancel},
		{"accepted before first token", chatBody, func(h *harness, m *nats.Msg) {
			h.accept(m)
		}, false, schemas.CancelSubject(fakeWorker)},
		{"queued, stream:false", unaryBody, func(h *harness, m *nats.Msg) {
			h.reply(m, schemas.FrameQueued, 0, `{"position":1,"timeout_ms":60000}`)
		}, false, schemas.QueueCancel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{worker: tc.worker})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := h.http.Do(req)
				if err != nil {
					return // cancelled before the headers: expected when queued
				}
				defer resp.Body.Close()
				if tc.readOne {
					ev, err := readEvent(bufio.NewReader(resp.Body))
					if err != nil || ev != chatRole {
						t.Errorf("first event %q, %v", ev, err)
					}
					cancel()
				}
			}()
			m := h.nextRequest(t)
			id := m.Header.Get(schemas.HdrRequestID)
			if !tc.readOne {
				cancel()
			}
			<-done
			// If the hang-up is seen before the accepted frame arrived, the
			// client cancels in the queues first and at the worker as soon as
			// the late accepted frame comes: wait for the one we want.
			for {
				c := h.nextCancel(t)
				if string(c.Data) != string(schemas.CancelBody(id, m.Header.Get(schemas.HdrCancelToken))) {
					t.Fatalf("cancel on %q for %q, want request %q with its cancel token", c.Subject, c.Data, id)
				}
				if c.Subject == tc.subject {
					break
				}
			}
			testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_client_disconnects_total", 1))
			testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 0))
		})
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	resp, body := h.get(t, "/health")
	if resp.StatusCode != 200 || body != `{"status":"ok"}` {
		t.Fatalf("/health %d %s", resp.StatusCode, body)
	}
	resp, body = h.get(t, "/ready")
	if resp.StatusCode != 200 || !strings.Contains(body, `"workers":1`) {
		t.Fatalf("/ready %d %s", resp.StatusCode, body)
	}
	h.cat.setWorkers(0)
	resp, body = h.get(t, "/ready")
	if resp.StatusCode != 503 {
		t.Fatalf("/ready without workers %d %s", resp.StatusCode, body)
	}
	if e := openAIError(t, body); e["code"] != schemas.CodeNoWorker {
		t.Fatalf("/ready error %s", body)
	}
	h.cat.setWorkers(1)
	// Up but unable to serve (its engine unhealthy): not ready.
	h.cat.setServing(false)
	resp, body = h.get(t, "/ready")
	if resp.StatusCode != 503 {
		t.Fatalf("/ready with no worker serving %d %s", resp.StatusCode, body)
	}
	if e := openAIError(t, body); e["code"] != "no_healthy_worker" {
		t.Fatalf("/ready error %s", body)
	}
	h.cat.setServing(true)

	h.post(t, "/v1/chat/completions", "application/json", chatBody, nil)
	h.post(t, "/v1/chat/completions", "application/json", unaryBody, nil)
	h.post(t, "/v1/chat/completions", "application/json", `{"model":"secret-model-name","messages":[{"role":"user","content":"hi"}]}`, nil)
	h.get(t, "/v1/models/"+testSlashedModel)
	h.get(t, "/some/random/path")
	testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 0))

	resp, body = h.get(t, "/metrics")
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	for _, name := range []string{
		"tokenbus_gateway_requests_total", "tokenbus_gateway_time_to_first_token_seconds",
		"tokenbus_gateway_inter_token_latency_seconds", "tokenbus_gateway_request_duration_seconds",
		"tokenbus_gateway_active_streams", "tokenbus_gateway_client_disconnects_total",
		"tokenbus_gateway_output_chunks_total",
	} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if strings.Contains(body, "secret-model-name") || strings.Contains(body, "/some/random/path") {
		t.Error("unbounded label values in /metrics")
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tokenbus_gateway_requests_total", map[string]string{"route": "/v1/chat/completions", "model": testModel, "status": "200"}, 2},
		{"tokenbus_gateway_requests_total", map[string]string{"route": "/v1/chat/completions", "model": "unknown", "status": "404"}, 1},
		{"tokenbus_gateway_requests_total", map[string]string{"route": "/v1/models/*", "model": testSlashedModel, "status": "200"}, 1},
		{"tokenbus_gateway_requests_total", map[string]string{"route": "unmatched", "status": "404"}, 1},
		{"tokenbus_gateway_time_to_first_token_seconds", map[string]string{"model": testModel}, 1},
		{"tokenbus_gateway_inter_token_latency_seconds", map[string]string{"model": testModel}, 3},
		{"tokenbus_gateway_request_duration_seconds", map[string]string{"route": "/v1/chat/completions", "model": testModel}, 2},
	} {
		if got := h.metric(t, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// Shutdown lets a stream that ends within the grace finish, and cuts one that
// does not: quickly, with an in-band 503 and a cancel to its worker.
func TestShutdown(t *testing.T) {
	t.Run("cut after grace", func(t *testing.T) {
		h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
			h.accept(m)
			h.reply(m, schemas.FrameChunk, 2, chatRole) // then silence
		}})
		req, _ := http.NewRequest(http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Content-Type", "application/json")
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		if ev, err := readEvent(r); err != nil || ev != chatRole {
			t.Fatalf("first event %q %v", ev, err)
		}
		m := h.nextRequest(t)
		id, token := m.Header.Get(schemas.HdrRequestID), m.Header.Get(schemas.HdrCancelToken)

		start := time.Now()
		err = h.shutdown(200 * time.Millisecond)
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Fatalf("Shutdown took %s", d)
		}
		if err == nil {
			t.Fatal("Shutdown that cut a stream returned nil")
		}
		ev, err := readEvent(r)
		if err != nil || !strings.Contains(ev, `"code":"shutting_down"`) {
			t.Fatalf("after the cut: %q %v", ev, err)
		}
		if ev, err := readEvent(r); err != nil || ev != "[DONE]" {
			t.Fatalf("after the error: %q %v", ev, err)
		}
		if c := h.nextCancel(t); string(c.Data) != string(schemas.CancelBody(id, token)) {
			t.Fatalf("cancel %q", c.Data)
		}
		if _, err := h.http.Get(h.base + "/health"); err == nil {
			t.Fatal("still accepting after Shutdown")
		}
	})
	t.Run("queued request is cut with 503", func(t *testing.T) {
		h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
			h.reply(m, schemas.FrameQueued, 0, `{"position":1,"timeout_ms":60000}`)
		}})
		got := h.postAsync(t, "/v1/chat/completions", chatBody)
		m := h.nextRequest(t)
		id, token := m.Header.Get(schemas.HdrRequestID), m.Header.Get(schemas.HdrCancelToken)
		start := time.Now()
		_ = h.shutdown(100 * time.Millisecond)
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Fatalf("Shutdown took %s", d)
		}
		r := <-got
		if r.status != 503 || r.retry != "1" || openAIError(t, r.body)["code"] != schemas.CodeShuttingDown {
			t.Fatalf("%+v", r)
		}
		if c := h.nextCancel(t); c.Subject != schemas.QueueCancel || string(c.Data) != string(schemas.CancelBody(id, token)) {
			t.Fatalf("cancel %q %q", c.Subject, c.Data)
		}
	})
	t.Run("finish within grace", func(t *testing.T) {
		release := make(chan struct{})
		h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
			h.accept(m)
			h.reply(m, schemas.FrameChunk, 2, chatRole)
			go func() {
				<-release
				h.reply(m, schemas.FrameChunk, 3, chatHello)
				h.reply(m, schemas.FrameDone, 4, doneChat)
			}()
		}})
		got := h.postAsync(t, "/v1/chat/completions", chatBody)
		h.nextRequest(t)
		testenv.WaitFor(t, 2*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 1))
		shut := make(chan error, 1)
		go func() { shut <- h.shutdown(5 * time.Second) }()
		testenv.WaitFor(t, 2*time.Second, func() error { // Shutdown has begun
			if !h.gw.draining.Load() {
				return errors.New("not draining")
			}
			return nil
		})
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v with a stream open", err)
		default:
		}
		close(release)
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if body := (<-got).body; body != "data: "+chatRole+"\n\ndata: "+chatHello+"\n\ndata: [DONE]\n\n" {
			t.Fatalf("body %q", body)
		}
	})
}
