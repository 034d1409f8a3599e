package simserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/vllm"
	"github.com/tokenbus/tokenbus/workers/lora"
)

// recSink records the chunk lines an engine hands over.
type recSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *recSink) Chunks(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		s.lines = append(s.lines, string(l))
	}
	return nil
}

func (s *recSink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lines)
}

// TestVLLMEngine drives the server with tokenbus's own vllm engine: the two
// must speak the same dialect. Generation, errors and cancelling are the
// conformance suite's (workers/engine/enginetest, which the vllm engine
// runs against this server); here is what the suite does not know: vLLM's
// LoRA quirks, and the load the engine reads from /metrics.
func TestVLLMEngine(t *testing.T) {
	sc := slowSim()
	sc.DecodeBase = 2 * time.Millisecond
	sc.MaxLoras = 2
	ts := start(t, Config{AllowRuntimeLoRA: true, APIKeys: []string{"secret"}}, sc)

	var cfg vllm.Config
	cfg.URL = ts.url + "/v1"
	cfg.APIKey = "secret"
	cfg.HealthInterval = 10 * time.Millisecond
	cfg.ModelsInterval = 50 * time.Millisecond
	cfg.MetricsInterval = 20 * time.Millisecond
	cfg.StallTimeout = 10 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := vllm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := e.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	stats := func(ok func(engine.Stats) bool) {
		t.Helper()
		testenv.WaitFor(t, 5*time.Second, func() error {
			if st := e.Stats(); !ok(st) {
				return fmt.Errorf("stats %+v", st)
			}
			return nil
		})
	}
	stats(func(st engine.Stats) bool { return st.MaxLoras == 2 }) // max_lora, read from /metrics

	t.Run("lora", func(t *testing.T) {
		if err := e.LoadAdapter(ctx, "sql", "/adapters/sql"); err != nil {
			t.Fatal(err)
		}
		if err := e.LoadAdapter(ctx, "sql", "/adapters/sql"); err != nil {
			t.Errorf("loading it again: %v", err) // vLLM's "already loaded" is a success
		}
		sink := &recSink{}
		req := &engine.Request{ID: "t-sql", Kind: schemas.KindChat, Model: "sql", Body: []byte(
			`{"model":"sql","messages":[{"role":"user","content":"Say something."}],"max_tokens":6,"ignore_eos":true,"stream":true}`)}
		res, err := e.Generate(ctx, req, sink)
		if err != nil || res.Usage.CompletionTokens == 0 || !strings.Contains(sink.all()[0], `"model":"sql"`) {
			t.Fatalf("generate on the adapter: %v %+v %q", err, res, sink.all())
		}

		// At max_loras (read from /metrics) the worker's adapter manager
		// evicts the least recently used adapter before a load, so the sim
		// never runs out.
		m := lora.New(e, lora.Config{Worker: "w1"})
		for _, a := range []string{"a2", "a3"} {
			if err := m.Load(ctx, a, "base", "/adapters/"+a); err != nil {
				t.Fatalf("load %s: %v", a, err)
			}
		}
		if got := ts.eng.Adapters(); len(got) != 2 || got["a2"] == "" || got["a3"] == "" {
			t.Errorf("the sim's adapters %v, want a2 and a3", got)
		}
		if err := e.UnloadAdapter(ctx, "a2"); err != nil {
			t.Error(err)
		}
		if err := e.UnloadAdapter(ctx, "never-loaded"); err != nil {
			t.Errorf("unloading an unknown adapter: %v", err) // vLLM's 404 is a success
		}
		if _, ok := ts.eng.Adapters()["a2"]; ok {
			t.Error("a2 still loaded")
		}
	})

	t.Run("load of another client", func(t *testing.T) {
		// A request from another client: only /metrics tells the engine.
		other, stop := context.WithCancel(ctx)
		resp := doCtx(t, other, http.MethodPost, ts.url+"/v1/completions",
			`{"prompt":"hi","max_tokens":5000,"ignore_eos":true,"stream":true}`, "Authorization", "Bearer secret")
		firstEvent(t, resp)
		stats(func(st engine.Stats) bool { return st.Running == 1 && st.KVCacheUsage > 0 })
		stop()
		resp.Body.Close()
		stats(func(st engine.Stats) bool { return st.Running == 0 })
	})
}

// TestVLLMEngineNoRuntimeLoRA: without runtime LoRA updating the routes are
// FastAPI's 404, which the vllm engine reports as a disabled LoRA API.
func TestVLLMEngineNoRuntimeLoRA(t *testing.T) {
	ts := start(t, Config{}, fastSim())
	var cfg vllm.Config
	cfg.URL = ts.url
	cfg.HealthInterval = 10 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := vllm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	err = e.LoadAdapter(t.Context(), "sql", "/adapters/sql")
	var se *schemas.Error
	if !errors.As(err, &se) || se.Status != 404 || se.Body.Code == nil || *se.Body.Code != "lora_api_disabled" {
		t.Errorf("LoadAdapter: %v, want a 404 lora_api_disabled", err)
	}
}
