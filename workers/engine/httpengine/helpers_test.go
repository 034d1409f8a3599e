package httpengine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/internal/fakevllm"
)

// startFake serves a fake vLLM on a random local port.
func startFake(t testing.TB) (*fakevllm.Server, *httptest.Server) {
	t.Helper()
	f := fakevllm.New()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

// serveAt serves h on addr (to bring a server back on the address of one
// that died).
func serveAt(t testing.TB, addr string, h http.Handler) *http.Server {
	t.Helper()
	var l net.Listener
	var err error
	eventually(t, 5*time.Second, func() bool { l, err = net.Listen("tcp", addr); return err == nil }, "listen on %s: %v", addr, err)
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// fastConfig polls often and gives up quickly.
func fastConfig(url string) Config {
	return Config{
		URL:            url,
		HealthInterval: 10 * time.Millisecond,
		ModelsInterval: 50 * time.Millisecond,
		StallTimeout:   5 * time.Second,
		UnhealthyAbort: -1,
		Logger:         slog.New(slog.DiscardHandler),
	}
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New("test", cfg, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func healthy(t testing.TB, e *Engine) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return e.Health(t.Context()) == nil }, "engine never healthy: %v", e.Health(t.Context()))
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: "+format, append([]any{d}, args...)...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recSink records each Chunks call's lines.
type recSink struct {
	mu     sync.Mutex
	calls  [][]string
	onCall func(n int) error
}

func (s *recSink) Chunks(b []byte) error {
	s.mu.Lock()
	var lines []string
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		lines = append(lines, string(l))
	}
	s.calls = append(s.calls, lines)
	n, f := len(s.calls), s.onCall
	s.mu.Unlock()
	if f != nil {
		return f(n)
	}
	return nil
}

func (s *recSink) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		out = append(out, c...)
	}
	return out
}

func (s *recSink) ncalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

var reqSeq struct {
	sync.Mutex
	n int
}

// chat makes a chat request with a fresh id.
func chat(body string) *engine.Request {
	reqSeq.Lock()
	reqSeq.n++
	id := fmt.Sprintf("req-%d", reqSeq.n)
	reqSeq.Unlock()
	// These tests are about the transport: a body that names no messages
	// gets one, so that it is a chat request every reader accepts.
	if strings.HasPrefix(body, "{") && !strings.Contains(body, `"messages"`) {
		body = `{"messages":[{"role":"user","content":"hi"}],` + strings.TrimPrefix(body, "{")
		body = strings.Replace(body, `,}`, `}`, 1)
	}
	return &engine.Request{ID: id, Kind: schemas.KindChat, Model: "base", Body: []byte(body)}
}

// asError checks that err is a *schemas.Error with status (and code, if not "").
func asError(t testing.TB, err error, status int, code string) *schemas.Error {
	t.Helper()
	var se *schemas.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *schemas.Error", err, err)
	}
	if se.Status != status {
		t.Fatalf("status %d, want %d: %v", se.Status, status, se)
	}
	if code != "" && (se.Body.Code == nil || *se.Body.Code != code) {
		t.Fatalf("code %v, want %q: %v", se.Body.Code, code, se)
	}
	return se
}
