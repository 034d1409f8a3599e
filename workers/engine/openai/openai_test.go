package openai

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

var quiet = slog.New(slog.DiscardHandler)

type countSink struct{ n int }

func (s *countSink) Chunks(b []byte) error { s.n += strings.Count(string(b), "\n") + 1; return nil }

func newServer(t *testing.T, key string) *httptest.Server {
	f := fakevllm.New()
	f.Base = []string{"llama", "qwen"}
	f.APIKey = key
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

// newEngine starts the engine on cfg, polling often, and waits until it is
// ready (healthy, its models read); it closes with the test.
func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	cfg.HealthInterval = 10 * time.Millisecond
	cfg.ModelsInterval = 50 * time.Millisecond
	cfg.StallTimeout = 5 * time.Second
	cfg.Logger = quiet
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	testenv.WaitFor(t, 5*time.Second, func() error {
		if len(e.Models()) == 0 {
			return fmt.Errorf("no models yet; health: %v", e.Health(t.Context()))
		}
		return e.Health(t.Context())
	})
	return e
}

// The engine knows no metrics and no LoRA API: its models are the server's
// (read with the key), its load its own requests in flight and nothing
// else. The rest of the contract is the conformance suite's.
func TestOpenAI(t *testing.T) {
	srv := newServer(t, "sk-1")
	e := newEngine(t, Config{URL: srv.URL + "/v1", APIKey: "sk-1"})
	var eng engine.Engine = e
	if _, ok := eng.(engine.Adapters); ok || eng.Name() != "openai" {
		t.Errorf("name %s; adapters %v", eng.Name(), ok)
	}
	if ms := e.Models(); !slices.Equal(ms, []string{"llama", "qwen"}) {
		t.Errorf("models %v", ms)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		e.Generate(ctx, &engine.Request{ID: "slow", Kind: schemas.KindChat, Model: "llama",
			Body: []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"x_fake":{"mode":"slow"}}`)}, &countSink{})
		close(done)
	}()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if st := e.Stats(); st.Running != 1 || st.Waiting != 0 || st.KVCacheUsage != 0 || st.Adapters != nil || st.MaxLoras != 0 {
			return fmt.Errorf("stats %+v, want Running 1 and nothing else", st)
		}
		return nil
	})
	cancel()
	<-done
	if st := e.Stats(); st.Running != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestOpenAIWrongKeyAndStaticModels(t *testing.T) {
	srv := newServer(t, "sk-1")
	e, err := New(Config{URL: srv.URL, APIKey: "wrong", Models: []string{"served-name"}, HealthInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if err := e.Health(t.Context()); err == nil || !strings.Contains(err.Error(), "401") {
			return fmt.Errorf("health %v, want a 401", err)
		}
		return nil
	})
	if !slices.Equal(e.Models(), []string{"served-name"}) {
		t.Errorf("models %v", e.Models())
	}
	_, err = e.Generate(t.Context(), &engine.Request{ID: "y", Kind: schemas.KindChat, Model: "served-name", Body: []byte(`{"model":"served-name","messages":[{"role":"user","content":"hi"}]}`)}, &countSink{})
	if se, ok := err.(*schemas.Error); !ok || se.Status != 401 || se.Body.Type != schemas.TypeAuthentication {
		t.Errorf("%v", err)
	}
}

func TestOpenAIHealthPath(t *testing.T) {
	srv := newServer(t, "")
	e, err := New(Config{URL: srv.URL, HealthPath: "/nope", HealthInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if err := e.Health(t.Context()); err == nil || !strings.Contains(err.Error(), "/nope answered 404") {
			return fmt.Errorf("health %v, want /nope's 404", err)
		}
		return nil
	})
}
