package vllm

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// TestMain doubles as the child-process stand-in for "vllm serve": with
// FAKEVLLM_CHILD=1 the test binary serves fakevllm on the --port of its
// arguments instead of running tests.
func TestMain(m *testing.M) {
	if os.Getenv("FAKEVLLM_CHILD") == "1" {
		runChild()
		return
	}
	os.Exit(m.Run())
}

func runChild() {
	port := httpengine.FlagValue(strings.Join(os.Args[1:], " "), "--port")
	f := fakevllm.New()
	if len(os.Args) > 2 && os.Args[1] == "serve" && !strings.HasPrefix(os.Args[2], "-") {
		f.Base = []string{os.Args[2]} // vllm serve <model>
	}
	if os.Getenv("FAKEVLLM_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	if os.Getenv("FAKEVLLM_UNHEALTHY") == "1" {
		f.SetHealthy(false)
	}
	fmt.Fprintf(os.Stderr, "INFO fake vllm serving on port %s\n", port)
	err := http.ListenAndServe("127.0.0.1:"+port, f)
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func startFake(t testing.TB) (*fakevllm.Server, *httptest.Server) {
	t.Helper()
	f := fakevllm.New()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func fastConfig(url string) Config {
	var c Config
	c.URL = url
	c.HealthInterval = 10 * time.Millisecond
	c.ModelsInterval = 50 * time.Millisecond
	c.MetricsInterval = 20 * time.Millisecond
	c.StallTimeout = 5 * time.Second
	c.Logger = slog.New(slog.DiscardHandler)
	return c
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	healthy(t, e, 10*time.Second)
	return e
}

func healthy(t testing.TB, e *Engine, d time.Duration) {
	t.Helper()
	testenv.WaitFor(t, d, func() error { return e.Health(t.Context()) })
}

// wantStats waits until the engine's Stats pass ok.
func wantStats(t testing.TB, e *Engine, ok func(engine.Stats) bool) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if st := e.Stats(); !ok(st) {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
}

// recSink is the engines' one recording sink.
type recSink = enginetest.Sink

var seq struct {
	sync.Mutex
	n int
}

// request is a streaming chat request for model, with extra JSON fields.
func request(model, extra string) *engine.Request {
	seq.Lock()
	seq.n++
	id := fmt.Sprintf("r%d", seq.n)
	seq.Unlock()
	return &engine.Request{ID: id, Kind: schemas.KindChat, Model: model,
		Body: fmt.Appendf(nil, `{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]%s}`, model, extra)}
}

func asError(t testing.TB, err error, status int) *schemas.Error {
	t.Helper()
	var se *schemas.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *schemas.Error", err, err)
	}
	if se.Status != status {
		t.Fatalf("status %d, want %d: %v", se.Status, status, se)
	}
	return se
}
