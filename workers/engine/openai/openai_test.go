package openai

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/internal/fakevllm"
)

func eventually(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(format, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

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

func TestOpenAI(t *testing.T) {
	srv := newServer(t, "sk-1")
	e, err := New(Config{URL: srv.URL + "/v1", APIKey: "sk-1", HealthInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var eng engine.Engine = e
	if _, ok := eng.(engine.Adapters); ok || eng.Name() != "openai" {
		t.Errorf("name %s; adapters %v", eng.Name(), ok)
	}
	// Health and models from /v1/models, with the key.
	eventually(t, func() bool { return slices.Equal(e.Models(), []string{"llama", "qwen"}) }, "models %v", e.Models())
	if err := e.Health(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Load is the engine's own requests in flight.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		e.Generate(ctx, &engine.Request{ID: "slow", Kind: schemas.KindChat, Model: "llama",
			Body: []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"x_fake":{"mode":"slow"}}`)}, &countSink{})
		close(done)
	}()
	eventually(t, func() bool { return e.Stats().Running == 1 }, "stats %+v", e.Stats())
	cancel()
	<-done
	if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.KVCacheUsage != 0 || st.Adapters != nil {
		t.Errorf("stats %+v", st)
	}

	var sink countSink
	res, err := e.Generate(t.Context(), &engine.Request{ID: "x", Kind: schemas.KindCompletion, Model: "qwen",
		Body: []byte(`{"model":"qwen","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`)}, &sink)
	if err != nil || sink.n != 4 || res.Usage.TotalTokens != 10 {
		t.Errorf("%v, %d chunks, usage %+v", err, sink.n, res.Usage)
	}
}

func TestOpenAIWrongKeyAndStaticModels(t *testing.T) {
	srv := newServer(t, "sk-1")
	e, err := New(Config{URL: srv.URL, APIKey: "wrong", Models: []string{"served-name"}, HealthInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	eventually(t, func() bool {
		err := e.Health(t.Context())
		return err != nil && strings.Contains(err.Error(), "401")
	}, "health %v", e.Health(t.Context()))
	if !slices.Equal(e.Models(), []string{"served-name"}) {
		t.Errorf("models %v", e.Models())
	}
	_, err = e.Generate(t.Context(), &engine.Request{ID: "y", Kind: schemas.KindChat, Model: "llama", Body: []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)}, &countSink{})
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
	eventually(t, func() bool {
		err := e.Health(t.Context())
		return err != nil && strings.Contains(err.Error(), "/nope answered 404")
	},
		"health %v", e.Health(t.Context()))
}
