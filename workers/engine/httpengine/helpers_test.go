package httpengine

import (
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

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
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
	testenv.WaitFor(t, 5*time.Second, func() (err error) { l, err = net.Listen("tcp", addr); return err })
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
	testenv.WaitFor(t, 5*time.Second, func() error { return e.Health(t.Context()) })
}

// unhealthy waits until the engine sees its server fail.
func unhealthy(t testing.TB, e *Engine) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if e.Health(t.Context()) == nil {
			return errors.New("still healthy")
		}
		return nil
	})
}

// arrived waits until the fake has the body of request id.
func arrived(t testing.TB, f *fakevllm.Server, id string) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if f.Body(id) == nil {
			return fmt.Errorf("request %s never reached the server", id)
		}
		return nil
	})
}

// recSink is the engines' one recording sink.
type recSink = enginetest.Sink

var reqSeq struct {
	sync.Mutex
	n int
}

// chat makes a chat request with a fresh id. These tests are about the
// transport: a body that names no messages gets one, so that it is a chat
// request every reader accepts.
func chat(body string) *engine.Request {
	if strings.HasPrefix(body, "{") && !strings.Contains(body, `"messages"`) {
		body = `{"messages":[{"role":"user","content":"hi"}],` + strings.TrimPrefix(body, "{")
		body = strings.Replace(body, `,}`, `}`, 1)
	}
	return newRequest(schemas.KindChat, body)
}

// completion makes a completion request with a fresh id, its body given a
// prompt as chat gives messages.
func completion(body string) *engine.Request {
	if strings.HasPrefix(body, "{") && !strings.Contains(body, `"prompt"`) {
		body = `{"prompt":"hi",` + strings.TrimPrefix(body, "{")
		body = strings.Replace(body, `,}`, `}`, 1)
	}
	return newRequest(schemas.KindCompletion, body)
}

func newRequest(kind schemas.Kind, body string) *engine.Request {
	reqSeq.Lock()
	reqSeq.n++
	id := fmt.Sprintf("req-%d", reqSeq.n)
	reqSeq.Unlock()
	return &engine.Request{ID: id, Kind: kind, Model: "base", Body: []byte(body)}
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
