package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// Authorize runs before publishing; its tenant travels on the bus and to
// OnUsage; its errors keep their status.
func TestAuthorize(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{
		Authorize: func(c *fiber.Ctx, req *schemas.Request) (Principal, error) {
			if req.Model != "llama-8b" {
				return Principal{}, schemas.ErrInternal.New()
			}
			switch c.Get("Authorization") {
			case "Bearer good":
				return Principal{Tenant: "acme", KeyID: "key_1", Reserved: 40, Window: 7}, nil
			case "Bearer limited":
				e := schemas.FromUpstream(429, schemas.TypeRateLimit, "rate_limit_exceeded", "", "slow down")
				e.RetryAfter = 9
				return Principal{}, e
			}
			return Principal{}, schemas.FromUpstream(401, schemas.TypeAuthentication, "invalid_api_key", "", "Incorrect API key provided.")
		},
	}})
	for _, tc := range []struct {
		key    string
		status int
		retry  string
	}{{"Bearer good", 200, ""}, {"Bearer limited", 429, "9"}, {"", 401, ""}} {
		for _, body := range []string{chatBody, unaryBody} {
			resp, got := h.post(t, "/v1/chat/completions", "application/json", body, map[string]string{"Authorization": tc.key})
			if resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != tc.retry {
				t.Fatalf("key %q: %d %q %s", tc.key, resp.StatusCode, resp.Header.Get("Retry-After"), got)
			}
			if tc.status != 200 {
				openAIError(t, got)
				continue
			}
			if tenant := h.nextRequest(t).Header.Get(schemas.HdrTenant); tenant != "acme" {
				t.Fatalf("Tb-Tenant %q", tenant)
			}
		}
	}
	testenv.WaitFor(t, 2*time.Second, h.usageIs(2))
	if u := h.usageCalls(); u[0] != "acme llama-8b 11" || u[1] != "acme llama-8b 11" {
		t.Fatalf("OnUsage %q", u)
	}
	// The record carries the request id (what makes it count once) and the
	// principal's reservation, to be settled.
	h.usageMu.Lock()
	defer h.usageMu.Unlock()
	for _, r := range h.records {
		if r.RequestID == "" || r.KeyID != "key_1" || r.Reserved != 40 || r.Window != 7 {
			t.Fatalf("record %+v", r)
		}
	}
	if h.records[0].RequestID == h.records[1].RequestID {
		t.Fatalf("two requests, one id: %+v", h.records)
	}
}

// A panicking OnUsage hook breaks neither kind of response.
func TestOnUsagePanic(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{OnUsage: func(schemas.UsageRecord) { panic("hook bug") }}})
	if resp, body := h.post(t, "/v1/chat/completions", "application/json", chatBody, nil); resp.StatusCode != 200 || body != standardSSE(chatFrames) {
		t.Fatalf("stream %d %q", resp.StatusCode, body)
	}
	if resp, body := h.post(t, "/v1/chat/completions", "application/json", unaryBody, nil); resp.StatusCode != 200 || body != chatFull {
		t.Fatalf("unary %d %q", resp.StatusCode, body)
	}
}

// RequestTimeout ends a request: 504 before the first chunk, an in-band 504
// after it; either way the worker is told to stop.
func TestRequestTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{RequestTimeout: 300 * time.Millisecond},
		worker: func(h *harness, m *nats.Msg) {
			h.accept(m)
			if strings.Contains(string(m.Data), "after") {
				h.reply(m, schemas.FrameChunk, 2, chatRole)
			}
		}})
	resp, body := h.post(t, "/v1/chat/completions", "application/json", chatBody, nil)
	if resp.StatusCode != 504 || openAIError(t, body)["code"] != "timeout" {
		t.Fatalf("before first chunk: %d %s", resp.StatusCode, body)
	}
	if c := h.nextCancel(t); c.Subject != schemas.CancelSubject(fakeWorker) {
		t.Fatalf("cancel on %q", c.Subject)
	}
	resp, body = h.post(t, "/v1/chat/completions", "application/json",
		`{"model":"llama-8b","messages":[{"role":"user","content":"after"}],"stream":true}`, nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "data: "+chatRole+"\n\ndata: {\"error\":") ||
		!strings.Contains(body, `"code":"timeout"`) || !strings.HasSuffix(body, "\n\ndata: [DONE]\n\n") {
		t.Fatalf("after first chunk: %d %q", resp.StatusCode, body)
	}
	h.nextCancel(t)
}

// /ready without NATS, and a client that is closed, through app.Test.
func TestReadyWithoutNATS(t *testing.T) {
	g := New(Config{}, nil, &fakeCatalog{workers: 3}, nil, nil, nil)
	resp, err := g.App().Test(httptest.NewRequest(http.MethodGet, "/ready", nil))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || openAIError(t, string(b))["code"] != schemas.CodeBusUnavailable {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if err := g.Shutdown(context.Background()); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	resp, err = g.App().Test(httptest.NewRequest(http.MethodGet, "/ready", nil))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || openAIError(t, string(b))["code"] != schemas.CodeShuttingDown {
		t.Fatalf("draining: %d %s", resp.StatusCode, b)
	}
}

// Priority (vLLM's body field) and W3C trace context travel as bus headers.
func TestBusHeaders(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, body := h.post(t, "/v1/completions", "application/json", `{"model":"llama-8b","prompt":"hi","priority":-3}`,
		map[string]string{"traceparent": tp})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	m := h.nextRequest(t)
	if m.Header.Get(schemas.HdrPriority) != "-3" || m.Header.Get(schemas.HdrTrace) != tp {
		t.Fatalf("headers %v", m.Header)
	}
	h.post(t, "/v1/completions", "application/json", `{"model":"llama-8b","prompt":"hi"}`,
		map[string]string{"traceparent": "garbage"})
	m = h.nextRequest(t)
	if _, ok := m.Header[schemas.HdrPriority]; ok || m.Header.Get(schemas.HdrTrace) != "" {
		t.Fatalf("headers %v", m.Header)
	}
	resp, body = h.post(t, "/v1/completions", "application/json", `{"model":"llama-8b","prompt":"hi","priority":"high"}`, nil)
	if resp.StatusCode != 400 || openAIError(t, body)["param"] != "priority" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// A request silent for longer than ReadTimeout is not mistaken for a gone
// client: fasthttp's read deadline from reading the request has expired by
// then, and the probe must not trip over it.
func TestSilenceLongerThanReadTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{ReadTimeout: 100 * time.Millisecond},
		worker: func(h *harness, m *nats.Msg) {
			h.accept(m)
			if isStream(m) {
				h.reply(m, schemas.FrameChunk, 2, chatRole)
			}
			time.AfterFunc(400*time.Millisecond, func() { // the silence under test
				if isStream(m) {
					h.reply(m, schemas.FrameChunk, 3, chatHello)
					h.reply(m, schemas.FrameDone, 4, doneChat)
				} else {
					h.reply(m, schemas.FrameDone, 2, chatFull)
				}
			})
		}})
	resp, body := h.post(t, "/v1/chat/completions", "application/json", chatBody, nil)
	if resp.StatusCode != 200 || body != "data: "+chatRole+"\n\ndata: "+chatHello+"\n\ndata: [DONE]\n\n" {
		t.Fatalf("stream %d %q", resp.StatusCode, body)
	}
	resp, body = h.post(t, "/v1/chat/completions", "application/json", unaryBody, nil)
	if resp.StatusCode != 200 || body != chatFull {
		t.Fatalf("unary %d %q", resp.StatusCode, body)
	}
	if n := h.metric(t, "tokenbus_gateway_client_disconnects_total", nil); n != 0 {
		t.Fatalf("%v false disconnects", n)
	}
	select {
	case c := <-h.cancels:
		t.Fatalf("cancel published: %s", c.Data)
	default:
	}
}

// A body far over the limit gets a clean 413, not a connection reset: the
// client is still sending when fasthttp refuses it.
func TestBodyFarOverLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{BodyLimit: 64 << 10}})
	for _, size := range []int{100 << 10, 16 << 20} {
		big := `{"model":"llama-8b","prompt":"` + strings.Repeat("x", size) + `"}`
		resp, body := h.post(t, "/v1/completions", "application/json", big, nil)
		if resp.StatusCode != 413 || openAIError(t, body)["code"] != "request_too_large" {
			t.Fatalf("%d bytes: %d %s", size, resp.StatusCode, body)
		}
	}
	// Compressed bodies are refused, not inflated.
	resp, body := h.post(t, "/v1/completions", "application/json", promptBody, map[string]string{"Content-Encoding": "gzip"})
	if resp.StatusCode != 415 {
		t.Fatalf("gzip: %d %s", resp.StatusCode, body)
	}
	// The gateway still serves.
	if resp, body := h.post(t, "/v1/completions", "application/json", promptBody, nil); resp.StatusCode != 200 {
		t.Fatalf("after: %d %s", resp.StatusCode, body)
	}
}
