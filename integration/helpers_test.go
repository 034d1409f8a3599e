// Package integration runs tokenbus end to end: real NATS server, real Redis
// (redis-server), real HTTP, official OpenAI clients.
package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/internal/tracing/otlp"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// dev is a `tokenbus dev` program running inside the test process.
type dev struct {
	*program.Dev
	URL      string // http://host:port
	NATSURL  string
	AdminURL string // http://host:port of the admin API
	stop     func() time.Duration
}

// process is what the tokenbus command sets up around a program: logs and
// tracing.
type process struct {
	otlp string       // export traces here, as --otlp-endpoint does ("": tracing off)
	log  *slog.Logger // nil: warnings and errors to the test's log
}

// startDev starts dev with every port chosen at run time, configured by
// configure, and waits until it serves. It stops with the test; stop() stops
// it early and says how long that took.
func startDev(t *testing.T, configure ...func(*program.DevConfig)) *dev {
	t.Helper()
	return startDevIn(t, process{}, configure...)
}

// startDevIn is startDev in a process with p's logs and tracing.
func startDevIn(t *testing.T, p process, configure ...func(*program.DevConfig)) *dev {
	t.Helper()
	cfg := program.DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:-1"
	cfg.Log = p.log
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})) // the programs add their components
	}
	for _, c := range configure {
		c(&cfg)
	}
	ctx := context.Background()
	// As the command does: tracing off unless an endpoint is given.
	stopTracing, err := otlp.Setup(ctx, otlp.Options{Endpoint: p.otlp, ServiceName: "tokenbus-dev", SampleRatio: 1, Logger: cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	h, err := program.StartDev(ctx, cfg)
	if err != nil {
		_ = stopTracing(ctx)
		t.Fatalf("tokenbus dev did not start: %v", err)
	}
	d := &dev{Dev: h, URL: "http://" + h.Addr(), NATSURL: h.NATSURL()}
	if h.AdminAddr() != "" {
		d.AdminURL = "http://" + h.AdminAddr()
	}
	var once sync.Once
	var took time.Duration
	d.stop = func() time.Duration {
		once.Do(func() {
			start := time.Now()
			if err := h.Close(); err != nil {
				t.Errorf("tokenbus dev: %v", err)
			}
			took = time.Since(start)
			// Spans still buffered are exported now, as at the command's exit.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stopTracing(sctx); err != nil {
				t.Errorf("trace export at the end: %v", err)
			}
		})
		return took
	}
	t.Cleanup(func() { d.stop() })
	if h.Workers() == 0 {
		waitPath(t, d.URL, "/health") // never ready: no worker
	} else {
		waitReady(t, d.URL)
	}
	return d
}

// vllmEngine makes dev front the vLLM-compatible server at url.
func vllmEngine(url string) func(*program.DevConfig) {
	return func(c *program.DevConfig) {
		c.Engine.Kind, c.Engine.URL = "vllm", url
		c.Adapters = nil // as the command: no example adapter but with the sim
	}
}

func waitReady(t *testing.T, base string) { t.Helper(); waitPath(t, base, "/ready") }

func waitPath(t *testing.T, base, path string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s%s never answered 200", base, path)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// openaiClient is the official Go SDK with retries off (they would hide 5xx).
func openaiClient(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second))
}

// sse is one parsed event stream.
type sse struct {
	Status  int
	Header  http.Header
	Events  []string // data payloads, [DONE] included
	Body    string   // non-stream body
	Elapsed time.Duration
}

// post sends body to path and reads the whole answer (SSE or JSON).
func post(t testing.TB, base, path, body string, hdr ...string) sse {
	t.Helper()
	req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	start := time.Now()
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out := sse{Status: resp.StatusCode, Header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				t.Errorf("non-data SSE line %q", line)
				continue
			}
			out.Events = append(out.Events, data)
		}
	} else {
		b, _ := io.ReadAll(resp.Body)
		out.Body = string(b)
	}
	out.Elapsed = time.Since(start)
	return out
}

var httpClient = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}

// errorBody decodes an OpenAI error body and checks its shape.
func errorBody(t testing.TB, body string) schemas.ErrorBody {
	t.Helper()
	var e struct {
		Error *schemas.ErrorBody `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
	var raw map[string]map[string]json.RawMessage
	_ = json.Unmarshal([]byte(body), &raw)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body lacks %q: %s", k, body)
		}
	}
	return *e.Error
}

// connectNATS connects to the NATS server at url for the rest of the test.
func connectNATS(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// heartbeats follows worker heartbeats on a NATS server.
type heartbeats struct {
	mu   sync.Mutex
	last map[string]schemas.Heartbeat
}

func watchHeartbeats(t *testing.T, natsURL string) *heartbeats {
	t.Helper()
	nc := connectNATS(t, natsURL)
	h := &heartbeats{last: map[string]schemas.Heartbeat{}}
	record := func(id string, running int, hb *schemas.Heartbeat) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if hb != nil {
			h.last[id] = *hb
			return
		}
		cur := h.last[id]
		cur.Running = running
		h.last[id] = cur
	}
	_, err := nc.Subscribe(schemas.HeartbeatPrefix+"*", func(m *nats.Msg) {
		var hb schemas.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			record(hb.Worker, 0, &hb)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nc.Subscribe(schemas.DonePrefix+"*", func(m *nats.Msg) {
		var d schemas.DoneNotice
		if json.Unmarshal(m.Data, &d) == nil {
			record(d.Worker, d.Running, nil)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// running sums the running counts the workers last reported.
func (h *heartbeats) running() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, hb := range h.last {
		n += hb.Running
	}
	return n
}

// tokenbusBinary is the tokenbus binary: TOKENBUS_TEST_BIN, built once by
// scripts/test for the whole suite, or else built here once per test run.
var buildOnce sync.Once
var binPath string
var buildErr error

func tokenbusBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("TOKENBUS_TEST_BIN"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tokenbus-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "tokenbus")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/tokenbus/tokenbus/cmd/tokenbus").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// metricValue reads one sample from the gateway's /metrics ("name{labels}" as
// Prometheus prints it); -1 if absent.
func metricValue(t testing.TB, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return -1
}

// sdkTimeout bounds one run of an SDK script: a hung client must fail the
// test, not hold the suite until go test's own timeout.
const sdkTimeout = 5 * time.Minute

// runSDK runs an official SDK's test script with the interpreter named by
// the environment variable env (TOKENBUS_TEST_PYTHON or TOKENBUS_TEST_NODE,
// which scripts/test sets) and args, and returns its output; without the
// variable it skips the test (fails it in CI). A script that fails, or does
// not print ok, fails the test.
func runSDK(t *testing.T, env, ok, script string, args ...string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not set: run the tests with scripts/test, which installs the SDK", env)
		}
		t.Skipf("%s not set: run scripts/test to install the official SDK", env)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sdkTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{script}, args...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ok) {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return string(out)
}

// startStore starts a Redis server and opens the registry on it, closed
// when the test ends.
func startStore(t *testing.T) (*testenv.Redis, *registry.Store) {
	t.Helper()
	rd := testenv.StartRedis(t)
	store, err := registry.Open(context.Background(), rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return rd, store
}
