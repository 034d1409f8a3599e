package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/program"
)

const (
	scopeGateway    = "github.com/tokenbus/tokenbus/gateway"
	scopeDispatcher = "github.com/tokenbus/tokenbus/dispatcher"
	scopeWorker     = "github.com/tokenbus/tokenbus/workers"
	scopeHTTPEngine = "github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// newTraceparent is a client's sampled traceparent in a fresh trace.
func newTraceparent() (traceparent, traceID, spanID string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	traceID, spanID = hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	return "00-" + traceID + "-" + spanID + "-01", traceID, spanID
}

// hops are a request's spans, one per component, found in one trace.
type hops struct {
	gateway, dispatcher, worker, engine *testenv.Span
}

// findHops picks the spans of each component in trace and checks there is
// one of each (the engine's only if wantEngine).
func findHops(t *testing.T, spans []testenv.Span, wantEngine bool) hops {
	t.Helper()
	var h hops
	for i := range spans {
		s := &spans[i]
		var slot **testenv.Span
		switch {
		case s.Scope == scopeGateway && s.Kind == "server":
			slot = &h.gateway
		case s.Scope == scopeDispatcher && s.Kind == "consumer":
			slot = &h.dispatcher
		case s.Scope == scopeWorker && s.Kind == "consumer":
			slot = &h.worker
		case s.Scope == scopeHTTPEngine && s.Kind == "client":
			slot = &h.engine
		default:
			t.Errorf("unexpected span %+v", *s)
			continue
		}
		if *slot != nil {
			t.Fatalf("two %s spans in one trace: %+v and %+v", s.Scope, **slot, *s)
		}
		*slot = s
	}
	if h.gateway == nil || h.dispatcher == nil || h.worker == nil || (wantEngine && h.engine == nil) {
		t.Fatalf("missing spans: gateway %v dispatcher %v worker %v engine %v; have %+v",
			h.gateway != nil, h.dispatcher != nil, h.worker != nil, h.engine != nil, spans)
	}
	if !wantEngine && h.engine != nil {
		t.Fatalf("an engine span with the sim engine: %+v", *h.engine)
	}
	return h
}

// TestTracingAcrossTheBus: a trace exported to an in-process OTLP receiver
// shows the spans across the bus with one trace id: the client's, gateway →
// dispatcher → worker, each the parent of the next.
// Not parallel: tracing is the process's (otel's global tracer provider).
func TestTracingAcrossTheBus(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	d := startDevIn(t, process{otlp: rcv.URL}, func(c *program.DevConfig) { c.SimWorkers = 1 })

	type request struct {
		name, path, body string
		status           int
		check            func(t *testing.T, s sse)
		gatewayError     bool   // the server span has status Error (a 5xx or a failed stream)
		workerError      string // error.type on the worker span ("" : none)
		outcome          string // tokenbus.outcome on the gateway span, on every path
		stream           bool
	}
	requests := []request{
		{name: "stream", path: "/v1/chat/completions", status: 200, stream: true, outcome: "done",
			body:  `{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			check: func(t *testing.T, s sse) { checkStream(t, s, true, 1, true) }},
		{name: "non-stream", path: "/v1/completions", status: 200, outcome: "done",
			body: `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`},
		{name: "engine refuses", path: "/v1/completions", status: 400, outcome: "context_length_exceeded",
			body: `{"model":"llama-8b","prompt":"x","max_tokens":100000}`, workerError: "context_length_exceeded"},
	}
	type sent struct {
		request
		traceID, spanID, requestID string
	}
	var all []sent
	for _, r := range requests {
		tp, traceID, spanID := newTraceparent()
		s := post(t, d.URL, r.path, r.body, "traceparent", tp)
		if s.Status != r.status {
			t.Fatalf("%s: status %d, want %d: %s", r.name, s.Status, r.status, s.Body)
		}
		if r.check != nil {
			r.check(t, s)
		}
		all = append(all, sent{r, traceID, spanID, s.Header.Get("X-Request-Id")})
	}
	// Every span has ended once the streams did; stopping flushes the exporter.
	d.stop()

	for _, r := range all {
		t.Run(r.name, func(t *testing.T) {
			h := findHops(t, rcv.Trace(r.traceID), false)
			chain := []struct {
				span   *testenv.Span
				parent string
				name   string
			}{
				{h.gateway, r.spanID, "POST " + r.path},
				{h.dispatcher, h.gateway.SpanID, "dispatch llama-8b"},
				{h.worker, h.dispatcher.SpanID, "generate llama-8b"},
			}
			for _, c := range chain {
				if c.span.ParentSpanID != c.parent || c.span.Name != c.name || c.span.Service != "tokenbus-dev" {
					t.Errorf("span %q (service %s) has parent %s, want %q with parent %s", c.span.Name, c.span.Service, c.span.ParentSpanID, c.name, c.parent)
				}
				if got := c.span.Attrs[tracing.AttrRequestID]; got != r.requestID {
					t.Errorf("%s: request id %q, want %q", c.span.Name, got, r.requestID)
				}
				if got := c.span.Attrs[tracing.AttrModel]; got != "llama-8b" {
					t.Errorf("%s: model %q", c.span.Name, got)
				}
			}
			if got := h.gateway.Attrs[tracing.AttrHTTPStatus]; got != strconv.Itoa(r.status) {
				t.Errorf("gateway span status %s, want %d", got, r.status)
			}
			if got := h.gateway.Attrs[tracing.AttrOutcome]; got != r.outcome {
				t.Errorf("gateway span outcome %q, want %q", got, r.outcome)
			}
			if h.gateway.StatusError != r.gatewayError {
				t.Errorf("gateway span error %v, want %v: %+v", h.gateway.StatusError, r.gatewayError, *h.gateway)
			}
			if w := h.dispatcher.Attrs[tracing.AttrWorker]; w == "" || w != h.worker.Attrs[tracing.AttrWorker] {
				t.Errorf("dispatcher chose %q, the worker span says %q", w, h.worker.Attrs[tracing.AttrWorker])
			}
			if h.dispatcher.Attrs[tracing.AttrMsgSystem] != "nats" || h.dispatcher.Attrs[tracing.AttrQueued] != "" {
				t.Errorf("dispatcher span attributes %v", h.dispatcher.Attrs)
			}
			if r.workerError != "" {
				if !h.worker.StatusError || h.worker.Attrs["error.type"] != r.workerError || h.worker.StatusMessage == "" {
					t.Errorf("worker span of a failed request: %+v", *h.worker)
				}
				if h.gateway.Attrs["error.type"] != r.workerError {
					t.Errorf("gateway span of a 4xx: %+v", *h.gateway)
				}
				return
			}
			if h.worker.StatusError || h.worker.Attrs[tracing.AttrOutputTokens] == "" || h.worker.Attrs[tracing.AttrInputTokens] == "" ||
				h.worker.Attrs[tracing.AttrUsageEstimated] != "" { // the sim counts its tokens
				t.Errorf("worker span %+v", *h.worker)
			}
			// A stream has one first-token event, never one per token.
			want := []string(nil)
			if r.stream {
				want = []string{tracing.EventFirstToken}
			}
			for _, s := range []*testenv.Span{h.gateway, h.worker} {
				if !slices.Equal(s.Events, want) {
					t.Errorf("%s span events %v, want %v", s.Name, s.Events, want)
				}
			}
		})
	}
}

// fakeEngine is the fake vLLM serving llama-8b, idle in its /metrics; it
// records the traceparent of every completion request it gets.
func fakeEngine(t *testing.T) (*fakevllm.Server, string) {
	f := fakevllm.New()
	f.Base = []string{"llama-8b"}
	f.SetMetrics("")
	srv := httptest.NewServer(f)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return f, srv.URL
}

// traceparents are the traceparents of the completion requests f got.
func traceparents(f *fakevllm.Server) []string {
	var out []string
	for _, r := range f.Received() {
		out = append(out, r.Header.Get("traceparent"))
	}
	return out
}

// TestTracingToVLLM: with --engine vllm the worker's engine client span is
// what the vLLM server gets as traceparent, in the client's trace.
// Not parallel: tracing is the process's (otel's global tracer provider).
func TestTracingToVLLM(t *testing.T) {
	eng, url := fakeEngine(t)
	rcv := testenv.StartOTLPReceiver(t)
	d := startDevIn(t, process{otlp: rcv.URL}, vllmEngine(url))

	tp, traceID, spanID := newTraceparent()
	checkStream(t, post(t, d.URL, "/v1/chat/completions",
		`{"model":"llama-8b","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "traceparent", tp), true, 1, false)
	d.stop()

	sent := traceparents(eng)
	if len(sent) != 1 {
		t.Fatalf("the engine got %d completion requests: %v", len(sent), sent)
	}
	h := findHops(t, rcv.Trace(traceID), true)
	if want := "00-" + traceID + "-" + h.engine.SpanID + "-01"; sent[0] != want {
		t.Fatalf("the engine got traceparent %q, want the client span's %q", sent[0], want)
	}
	for _, c := range []struct{ span, parent *testenv.Span }{
		{h.dispatcher, h.gateway}, {h.worker, h.dispatcher}, {h.engine, h.worker},
	} {
		if c.span.ParentSpanID != c.parent.SpanID {
			t.Errorf("span %q has parent %s, want %q (%s)", c.span.Name, c.span.ParentSpanID, c.parent.Name, c.parent.SpanID)
		}
	}
	if h.gateway.ParentSpanID != spanID {
		t.Errorf("the gateway span's parent is %s, not the client's %s", h.gateway.ParentSpanID, spanID)
	}
	if h.engine.Name != "POST /v1/chat/completions" || h.engine.Attrs[tracing.AttrHTTPStatus] != "200" || h.engine.StatusError ||
		h.engine.Attrs[tracing.AttrServerAddr] != "127.0.0.1" {
		t.Errorf("engine client span %+v", *h.engine)
	}
	// The stream asked for no usage: the worker counted one token per chunk
	// and knows no prompt count, which the spans say.
	for _, s := range []*testenv.Span{h.worker, h.engine} {
		if s.Attrs[tracing.AttrUsageEstimated] != "true" || s.Attrs[tracing.AttrOutputTokens] == "" || s.Attrs[tracing.AttrInputTokens] != "" {
			t.Errorf("%s span with estimated usage: %v", s.Name, s.Attrs)
		}
	}
}

// TestTracingClientGone: a stream:false request whose client hangs up ends
// its gateway span with status 499 and outcome client_gone, not as an error.
// Not parallel: tracing is the process's (otel's global tracer provider).
func TestTracingClientGone(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	d := startDevIn(t, process{otlp: rcv.URL}, func(c *program.DevConfig) {
		c.SimWorkers = 1
		c.Engine.Sim.DecodeBase = 20 * time.Millisecond // 500 tokens: 10 s, far past the hang-up
	})
	tp, traceID, _ := newTraceparent()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/v1/completions",
		strings.NewReader(`{"model":"llama-8b","max_tokens":500,"prompt":"hi"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", tp)
	errc := make(chan error, 1)
	go func() {
		resp, err := httpClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	// Hang up once the worker runs it.
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := metricValue(t, d.URL, `tokenbus_worker_running{worker="dev-worker-1"}`); n < 1 {
			return fmt.Errorf("worker running %v", n)
		}
		return nil
	})
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the request finished before the client hung up")
	}
	var gw *testenv.Span
	testenv.WaitFor(t, 10*time.Second, func() error {
		for _, s := range rcv.Trace(traceID) {
			if s.Scope == scopeGateway {
				gw = &s
				return nil
			}
		}
		return fmt.Errorf("no gateway span yet")
	})
	d.stop()
	if gw.Attrs[tracing.AttrHTTPStatus] != "499" || gw.Attrs[tracing.AttrOutcome] != "client_gone" || gw.StatusError ||
		gw.Attrs["error.type"] != "" {
		t.Fatalf("gateway span of a request whose client hung up: %+v", *gw)
	}
}

// TestTracingOff: with no --otlp-endpoint nothing is exported, not even to
// the endpoint OpenTelemetry's own environment names, and the client's
// traceparent reaches the engine unchanged.
// Not parallel: t.Setenv, and tracing is the process's.
func TestTracingOff(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.URL+"/v1/traces")
	eng, url := fakeEngine(t)
	d := startDev(t, vllmEngine(url))
	if tracing.Enabled() {
		t.Fatal("tracing is on with no endpoint")
	}
	tp, _, _ := newTraceparent()
	checkStream(t, post(t, d.URL, "/v1/chat/completions",
		`{"model":"llama-8b","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "traceparent", tp), true, 1, false)
	d.stop()
	if sent := traceparents(eng); len(sent) != 1 || sent[0] != tp {
		t.Fatalf("the engine got %v, want the client's %q passed through", sent, tp)
	}
	if n := rcv.Requests(); n != 0 {
		t.Fatalf("%d exports with tracing off", n)
	}
}

// jsonLog is the command's --log-format json --log-level debug, into w: no
// component of its own (the programs name theirs).
func jsonLog(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// syncBuffer collects a log written from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// TestLogsCarryRequestAndTraceIDs: every JSON log line about a request has
// its request_id and, with tracing on, its trace_id.
// Not parallel: tracing is the process's (otel's global tracer provider).
func TestLogsCarryRequestAndTraceIDs(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	var logs syncBuffer
	d := startDevIn(t, process{otlp: rcv.URL, log: jsonLog(&logs)}, func(c *program.DevConfig) { c.SimWorkers = 1 })
	tp, traceID, _ := newTraceparent()
	for _, r := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"model":"llama-8b","prompt":"x","max_tokens":100000}`},
	} {
		s := post(t, d.URL, r.path, r.body, "traceparent", tp, "X-Request-Id", "req-logs-"+strconv.Itoa(len(r.path)))
		if s.Header.Get("X-Request-Id") == "" {
			t.Fatal("no request id")
		}
	}
	d.stop()
	// Every line is one JSON object with unique keys (one component each).
	if _, err := testenv.ParseJSONLog([]byte(strings.Join(logs.lines(), "\n"))); err != nil {
		t.Fatal(err)
	}
	byComponent := map[string]int{}
	for _, line := range logs.lines() {
		if !strings.Contains(line, "req-logs-") {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON log line: %s", line)
		}
		id, _ := rec["request_id"].(string)
		if !strings.HasPrefix(id, "req-logs-") || rec["trace_id"] != traceID {
			t.Errorf("log line about a request without its request_id and trace_id: %s", line)
		}
		c, _ := rec["component"].(string)
		byComponent[c]++
	}
	// The gateway logs every request; the worker logs each at debug.
	if byComponent["gateway"] != 2 || byComponent["worker"] != 2 {
		t.Fatalf("request log lines by component: %v", byComponent)
	}
}
