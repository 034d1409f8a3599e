package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// metricIs is a condition for testenv.WaitFor: metric name (no labels) is want.
func (h *harness) metricIs(t *testing.T, name string, want float64) func() error {
	return func() error {
		if v := h.metric(t, name, nil); v != want {
			return fmt.Errorf("%s = %v, want %v", name, v, want)
		}
		return nil
	}
}

// usageIs is a condition for testenv.WaitFor: n usage records so far.
func (h *harness) usageIs(n int) func() error {
	return func() error {
		if got := h.usageCalls(); len(got) != n {
			return fmt.Errorf("%d usage records, want %d: %q", len(got), n, got)
		}
		return nil
	}
}

// fakeCatalog knows a fixed set of models.
type fakeCatalog struct {
	mu         sync.Mutex
	models     []string
	workers    int
	notServing bool // the workers up are unhealthy, draining or serve nothing
	maxLen     int  // MaxModelLen's answer (0: not known)
}

func (c *fakeCatalog) MaxModelLen(string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxLen
}

func (c *fakeCatalog) Known(model string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.models {
		if m == model {
			return true
		}
	}
	return false
}

func (c *fakeCatalog) Models() []schemas.Model {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]schemas.Model, 0, len(c.models))
	for _, m := range c.models {
		out = append(out, schemas.Model{ID: m, Created: 1700000000, MaxModelLen: 8192})
	}
	return out
}

func (c *fakeCatalog) WorkersUp() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.workers
}

// WorkersServing: every worker up serves, unless setServing(false).
func (c *fakeCatalog) WorkersServing() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notServing {
		return 0
	}
	return c.workers
}

func (c *fakeCatalog) setServing(yes bool) {
	c.mu.Lock()
	c.notServing = !yes
	c.mu.Unlock()
}

func (c *fakeCatalog) setWorkers(n int) {
	c.mu.Lock()
	c.workers = n
	c.mu.Unlock()
}

const (
	fakeWorker       = "fake-1"
	testModel        = "llama-8b"
	testSlashedModel = "meta-llama/Llama-3.1-8B"
)

// workerFunc stands in for dispatcher and worker: it gets each request
// published on tokenbus.v1.req.> and answers on its reply subject.
type workerFunc func(h *harness, m *nats.Msg)

// harness is one test's world: an embedded NATS server, a fake worker, and a
// gateway serving on a real 127.0.0.1 listener.
type harness struct {
	t    testing.TB
	nc   *nats.Conn // the gateway's
	wc   *nats.Conn // the fake worker's
	cl   *client.Client
	cat  *fakeCatalog
	reg  *prometheus.Registry
	gw   *Gateway
	base string // http://127.0.0.1:port
	http *http.Client

	reqs    chan *nats.Msg // every request the fake worker saw
	cancels chan *nats.Msg // messages on the worker's cancel subject and on QueueCancel

	usageMu sync.Mutex
	usage   []string // "tenant model total_tokens" per OnUsage call
	records []schemas.UsageRecord

	shutdownOnce sync.Once
}

type harnessOptions struct {
	cfg      Config
	worker   workerFunc // nil: standardWorker
	noWorker bool       // nobody subscribes to requests: NATS answers no responders
}

func newHarness(t testing.TB, o harnessOptions) *harness {
	t.Helper()
	ns := testenv.NATS(t) // closes after the cleanup below, which runs first
	h := &harness{t: t, cat: &fakeCatalog{models: []string{testModel, testSlashedModel}, workers: 1},
		reg: prometheus.NewRegistry(), reqs: make(chan *nats.Msg, 100), cancels: make(chan *nats.Msg, 100)}
	h.nc, h.wc = testenv.Connect(t, ns), testenv.Connect(t, ns)
	worker := o.worker
	if worker == nil {
		worker = standardWorker
	}
	if !o.noWorker {
		if _, err := h.wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) {
			h.reqs <- m
			worker(h, m)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{schemas.CancelSubject(fakeWorker), schemas.QueueCancel} {
		if _, err := h.wc.Subscribe(subj, func(m *nats.Msg) { h.cancels <- m }); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.wc.Flush(); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.cl, err = client.New(h.nc, client.Options{}); err != nil {
		t.Fatal(err)
	}

	cfg := o.cfg
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 25 * time.Millisecond
	}
	if cfg.OnUsage == nil {
		cfg.OnUsage = func(rec schemas.UsageRecord) {
			h.usageMu.Lock()
			h.usage = append(h.usage, fmt.Sprintf("%s %s %d", rec.Tenant, rec.Model, rec.Usage.TotalTokens))
			h.records = append(h.records, rec)
			h.usageMu.Unlock()
		}
	}
	level := slog.LevelError
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	h.gw = New(cfg, h.cl, h.cat, h.nc, h.reg, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.base = "http://" + ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- h.gw.Serve(ln) }()
	h.http = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		h.shutdown(5 * time.Second)
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Shutdown")
		}
		h.http.CloseIdleConnections()
		_ = h.cl.Close()
	})
	return h
}

func (h *harness) shutdown(grace time.Duration) error {
	var err error
	h.shutdownOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		err = h.gw.Shutdown(ctx)
	})
	return err
}

// reply publishes one frame to a request's reply subject.
func (h *harness) reply(m *nats.Msg, t schemas.FrameType, seq uint64, payload string) {
	if err := h.wc.Publish(m.Reply, schemas.AppendFrame(nil, t, seq, []byte(payload))); err != nil {
		h.t.Errorf("fake worker publish: %v", err)
	}
}

// accept sends the accepted frame (sequence 1) naming the fake worker.
func (h *harness) accept(m *nats.Msg) {
	b, _ := json.Marshal(schemas.Accepted{RequestID: m.Header.Get(schemas.HdrRequestID), Worker: fakeWorker,
		Cancel: schemas.CancelSubject(fakeWorker)})
	h.reply(m, schemas.FrameAccepted, 1, string(b))
}

func (h *harness) nextRequest(t *testing.T) *nats.Msg {
	t.Helper()
	select {
	case m := <-h.reqs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("the fake worker got no request")
		return nil
	}
}

func (h *harness) nextCancel(t *testing.T) *nats.Msg {
	t.Helper()
	select {
	case m := <-h.cancels:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no cancel was published")
		return nil
	}
}

func (h *harness) usageCalls() []string {
	h.usageMu.Lock()
	defer h.usageMu.Unlock()
	return append([]string(nil), h.usage...)
}

// Canned OpenAI objects the fake worker sends.
const (
	chatRole   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	chatHello  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`
	chatWorld  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]}`
	chatFinish = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`
	chatUsage  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	chatFull   = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"llama-8b","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`

	cmplHello  = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"llama-8b","choices":[{"index":0,"text":"Hello","logprobs":null,"finish_reason":null}]}`
	cmplWorld  = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"llama-8b","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"length"}]}`
	cmplUsage  = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"llama-8b","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	cmplFull   = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"llama-8b","choices":[{"index":0,"text":"Hello world","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	doneChat   = `{"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	doneCmpl   = `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	chatBody   = `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"stream":true}`
	unaryBody  = `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}]}`
	promptBody = `{"model":"llama-8b","prompt":"hi","stream":true}`
)

// chatFrames are the chunk frames of the standard chat stream; the second
// frame carries two chunk objects, as a worker does with tokens ready together.
var chatFrames = []string{chatRole, chatHello + "\n" + chatWorld, chatFinish, chatUsage}
var cmplFrames = []string{cmplHello, cmplWorld, cmplUsage}

// standardSSE is the exact body of the standard chat stream.
func standardSSE(frames []string) string {
	var b strings.Builder
	for _, f := range frames {
		for _, line := range strings.Split(f, "\n") {
			b.WriteString("data: " + line + "\n\n")
		}
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

func isStream(m *nats.Msg) bool {
	var b struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(m.Data, &b)
	return b.Stream
}

// standardWorker answers like a worker: accepted, the canned chunks and done
// for a stream; accepted and done with the whole object otherwise.
func standardWorker(h *harness, m *nats.Msg) {
	h.accept(m)
	chat := m.Header.Get(schemas.HdrKind) == string(schemas.KindChat)
	if !isStream(m) {
		if chat {
			h.reply(m, schemas.FrameDone, 2, chatFull)
		} else {
			h.reply(m, schemas.FrameDone, 2, cmplFull)
		}
		return
	}
	frames, done := chatFrames, doneChat
	if !chat {
		frames, done = cmplFrames, doneCmpl
	}
	seq := uint64(2)
	for _, f := range frames {
		h.reply(m, schemas.FrameChunk, seq, f)
		seq++
	}
	h.reply(m, schemas.FrameDone, seq, done)
}

// post sends a raw request and returns the response with its whole body.
func (h *harness) post(t *testing.T, path, contentType, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return h.do(t, req)
}

// result is a response to postAsync.
type result struct {
	status int
	retry  string
	body   string
}

// postAsync sends a JSON POST from another goroutine; the channel gets the
// response (status 0 on a transport error, which is reported).
func (h *harness) postAsync(t *testing.T, path, body string) <-chan result {
	out := make(chan result, 1)
	go func() {
		var r result
		defer func() { out <- r }()
		resp, err := h.http.Post(h.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Errorf("POST %s: %v", path, err)
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Errorf("POST %s: reading body: %v", path, err)
		}
		r = result{resp.StatusCode, resp.Header.Get("Retry-After"), string(b)}
	}()
	return out
}

func (h *harness) get(t *testing.T, path string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h.do(t, req)
}

func (h *harness) do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp, string(b)
}

// openAIError checks body is OpenAI's nested error with all four keys and
// returns it.
func openAIError(t *testing.T, body string) map[string]any {
	t.Helper()
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil {
		t.Fatalf("not an OpenAI error body: %q", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e.Error[k]; !ok {
			t.Fatalf("error body lacks %q: %s", k, body)
		}
	}
	if len(e.Error) != 4 {
		t.Fatalf("error body has extra keys: %s", body)
	}
	return e.Error
}

// readEvent reads one SSE event ("data: ...\n\n") from r, without the framing.
func readEvent(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	blank, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if blank != "\n" || !strings.HasPrefix(line, "data: ") {
		return "", fmt.Errorf("bad SSE framing: %q %q", line, blank)
	}
	return strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n"), nil
}

// metric returns the value of a counter or gauge (or a histogram's sample
// count) with the given labels, from the registry.
func (h *harness) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k {
			return l.GetValue() == v
		}
	}
	return false
}
