package simserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestVLLMEngine drives the server with tokenbus's own vllm engine: the
// two must speak the same dialect (generation, errors, LoRA, /metrics).
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
	eventually(t, 5*time.Second, func() bool { return slices.Contains(e.Models(), "base") }, "models %v", e.Models())
	eventually(t, 5*time.Second, func() bool { return e.Stats().MaxLoras == 2 }, "max_lora not read from /metrics: %+v", e.Stats())

	req := func(model, extra string) *engine.Request {
		return &engine.Request{ID: "t-" + model, Kind: schemas.KindChat, Model: model, Body: []byte(
			`{"model":"` + model + `","messages":[{"role":"user","content":"Say something."}],"max_tokens":6,"ignore_eos":true` + extra + `}`)}
	}

	t.Run("stream", func(t *testing.T) {
		sink := &recSink{}
		res, err := e.Generate(ctx, req("base", `,"stream":true,"stream_options":{"include_usage":true}`), sink)
		if err != nil {
			t.Fatal(err)
		}
		lines := sink.all()
		if res.Usage.CompletionTokens != 6 || res.Usage.PromptTokens == 0 || res.Response != nil {
			t.Errorf("result %+v", res)
		}
		// role, six tokens, finish, usage
		if len(lines) != 9 || !strings.Contains(lines[0], `"role":"assistant"`) || !strings.Contains(lines[8], `"usage":{`) {
			t.Errorf("chunks %q", lines)
		}
		for _, l := range lines {
			if !json.Valid([]byte(l)) || !strings.Contains(l, `"id":"chatcmpl-t-base"`) {
				t.Errorf("chunk %s", l)
			}
		}
	})

	t.Run("whole", func(t *testing.T) {
		res, err := e.Generate(ctx, req("base", ""), &recSink{})
		if err != nil {
			t.Fatal(err)
		}
		r := decode[response](t, res.Response)
		if r.Object != "chat.completion" || res.Usage.CompletionTokens != 6 || r.Usage == nil || *r.Usage != (usage{res.Usage.PromptTokens, 6, res.Usage.TotalTokens}) {
			t.Errorf("result %+v, response %s", res.Usage, res.Response)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			model, extra string
			status       int
			msg          string
		}{
			{"base", `,"n":0`, 400, "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead."},
			{"base", `,"n":0,"stream":true`, 400, "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead."},
			{"nope", `,"stream":true`, 404, "The model `nope` does not exist."},
		} {
			_, err := e.Generate(ctx, req(tc.model, tc.extra), &recSink{})
			var se *schemas.Error
			if !errors.As(err, &se) || se.Status != tc.status || se.Body.Message != tc.msg {
				t.Errorf("%s%s: %v, want %d %q", tc.model, tc.extra, err, tc.status, tc.msg)
			}
		}
	})

	t.Run("lora", func(t *testing.T) {
		if err := e.LoadAdapter(ctx, "sql", "/adapters/sql"); err != nil {
			t.Fatal(err)
		}
		if err := e.LoadAdapter(ctx, "sql", "/adapters/sql"); err != nil {
			t.Errorf("loading it again: %v", err) // vLLM's "already loaded" is a success
		}
		sink := &recSink{}
		res, err := e.Generate(ctx, req("sql", `,"stream":true`), sink)
		if err != nil || res.Usage.CompletionTokens == 0 || !strings.Contains(sink.all()[0], `"model":"sql"`) {
			t.Fatalf("generate on the adapter: %v %+v %q", err, res, sink.all())
		}
		eventually(t, 5*time.Second, func() bool { return slices.Contains(e.Models(), "sql") }, "models %v", e.Models())

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

	t.Run("stats and cancel", func(t *testing.T) {
		// A request from another client: only /metrics tells the engine.
		other, stop := context.WithCancel(ctx)
		resp := doCtx(t, other, http.MethodPost, ts.url+"/v1/completions",
			`{"prompt":"hi","max_tokens":5000,"ignore_eos":true,"stream":true}`, "Authorization", "Bearer secret")
		firstEvent(t, resp)
		eventually(t, 5*time.Second, func() bool { st := e.Stats(); return st.Running == 1 && st.KVCacheUsage > 0 },
			"stats %+v", e.Stats())
		stop()
		resp.Body.Close()
		eventually(t, 5*time.Second, func() bool { return e.Stats().Running == 0 }, "stats %+v", e.Stats())

		// A request of the engine's own, cancelled mid-stream: the server aborts it.
		gctx, gcancel := context.WithCancel(ctx)
		sink := &recSink{}
		errc := make(chan error, 1)
		go func() {
			long := &engine.Request{ID: "t-long", Kind: schemas.KindChat, Model: "base", Body: []byte(
				`{"model":"base","messages":[{"role":"user","content":"Say something."}],"max_tokens":5000,"ignore_eos":true,"stream":true}`)}
			_, err := e.Generate(gctx, long, sink)
			errc <- err
		}()
		eventually(t, 5*time.Second, func() bool { return len(sink.all()) > 0 && ts.eng.Stats().Running == 1 }, "not streaming")
		gcancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Generate after cancel: %v", err)
		}
		eventually(t, 5*time.Second, func() bool { return ts.eng.Stats().Running == 0 }, "the sim still runs it: %+v", ts.eng.Stats())
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
