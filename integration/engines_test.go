package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// simServer is a sim-server program (the sim behind vLLM's HTTP API) run
// inside the test; kill and start it again to kill and revive the engine.
type simServer struct {
	t   *testing.T
	cfg program.SimServerConfig
	mu  sync.Mutex
	srv *program.SimServer // nil while killed
}

// startSimServer starts a sim-server serving llama-8b on a port chosen at run
// time, with runtime LoRA loading on, configured by configure.
func startSimServer(t *testing.T, configure ...func(*program.SimServerConfig)) *simServer {
	cfg := program.DefaultSimServer()
	cfg.Listen, cfg.AllowRuntimeLoRA = "127.0.0.1:0", true
	cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})) // the program adds component=sim-server
	for _, c := range configure {
		c(&cfg)
	}
	s := &simServer{t: t, cfg: cfg}
	s.start()
	s.cfg.Listen = s.srv.Addr() // a revived engine comes back where it was
	t.Cleanup(s.kill)
	return s
}

func (s *simServer) URL() string { return "http://" + s.cfg.Listen }

func (s *simServer) start() {
	s.t.Helper()
	srv, err := program.StartSimServer(context.Background(), s.cfg)
	if err != nil {
		s.t.Fatalf("sim-server: %v", err)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
}

// kill stops the server, cutting open streams (within its shutdown timeout).
func (s *simServer) kill() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		if err := srv.Close(); err != nil {
			s.t.Errorf("sim-server: %v", err)
		}
	}
}

// metric reads one of the sim-server's vLLM metrics, summed over its label sets.
func (s *simServer) metric(name string) float64 {
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum, found = sum+v, true
		}
	}
	if !found {
		return -1
	}
	return sum
}

// TestVLLMEngine: a worker with --engine vllm in front of a vLLM-compatible
// server (tokenbus sim-server) over real HTTP, end to end through the gateway.
func TestVLLMEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: kills and revives the engine under load, ~6 s")
	}
	t.Parallel()
	ctx := context.Background()
	eng := startSimServer(t, func(c *program.SimServerConfig) {
		c.Sim.DecodeBase, c.Sim.PrefillBase = 2*time.Millisecond, 2*time.Millisecond
	})
	d := startDev(t, vllmEngine(eng.URL()))
	c := openaiClient(d.URL + "/v1")

	t.Run("stream and non-stream", func(t *testing.T) {
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "llama-8b", MaxTokens: openai.Int(9),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		if err != nil || resp.Usage.CompletionTokens != 9 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("non-stream: %+v %v", resp, err)
		}
		checkStream(t, post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"n":2,"stream_options":{"include_usage":true},"max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`), true, 2, true)
		checkStream(t, post(t, d.URL, "/v1/completions", `{"model":"llama-8b","stream":true,"max_tokens":5,"prompt":"hi"}`), false, 1, false)
	})

	t.Run("engine error", func(t *testing.T) {
		s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":100000,"prompt":"hi"}`)
		if s.Status != 400 || !strings.Contains(errorBody(t, s.Body).Message, "maximum context length") {
			t.Fatalf("status %d body %s", s.Status, s.Body)
		}
	})

	t.Run("cancel reaches the engine", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(cctx, "POST", d.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"llama-8b","stream":true,"max_tokens":5000,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1024)
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, func() error {
			if n := eng.metric("vllm:num_requests_running"); n != 1 {
				return fmt.Errorf("engine running %v, want 1", n)
			}
			return nil
		})
		cancel()
		resp.Body.Close()
		testenv.WaitFor(t, 3*time.Second, func() error {
			if n := eng.metric("vllm:num_requests_running"); n != 0 {
				return fmt.Errorf("engine still running %v after the client hung up", n)
			}
			return nil
		})
	})

	t.Run("engine killed mid-stream, then back", func(t *testing.T) {
		done := make(chan sse, 1)
		go func() {
			done <- post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":5000,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`)
		}()
		testenv.WaitFor(t, 5*time.Second, func() error {
			if n := eng.metric("vllm:num_requests_running"); n != 1 {
				return fmt.Errorf("engine running %v", n)
			}
			return nil
		})
		eng.kill()
		select {
		case s := <-done:
			last := s.Events[len(s.Events)-1]
			if s.Status != 200 || last != "[DONE]" || !strings.Contains(s.Events[len(s.Events)-2], `"error"`) {
				t.Fatalf("cut stream: status %d, ends with %v", s.Status, tail(s.Events, 2))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the stream hung after its engine died")
		}
		// With the engine down, requests fail fast and cleanly.
		testenv.WaitFor(t, 10*time.Second, func() error {
			s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`)
			if s.Status != 503 {
				return fmt.Errorf("status %d with the engine down: %s", s.Status, s.Body)
			}
			errorBody(t, s.Body)
			return nil
		})
		eng.start()
		testenv.WaitFor(t, 15*time.Second, func() error {
			if s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`); s.Status != 200 {
				return fmt.Errorf("status %d after the engine came back: %s", s.Status, s.Body)
			}
			return nil
		})
	})
}

// TestVLLMEngineLegacyErrors: vLLM before 0.10.1 answered errors flat;
// clients still get OpenAI's nested shape.
func TestVLLMEngineLegacyErrors(t *testing.T) {
	t.Parallel()
	eng := startSimServer(t, func(c *program.SimServerConfig) { c.LegacyErrors = true })
	d := startDev(t, vllmEngine(eng.URL()))
	for _, stream := range []string{"false", "true"} {
		s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","stream":`+stream+`,"max_tokens":100000,"prompt":"hi"}`)
		if s.Status != 400 {
			t.Fatalf("stream %s: status %d: %s %v", stream, s.Status, s.Body, s.Events)
		}
		if e := errorBody(t, s.Body); !strings.Contains(e.Message, "maximum context length") || e.Type != "invalid_request_error" {
			t.Fatalf("stream %s: %+v", stream, e)
		}
	}
}

// TestVLLMEngineLoRA: adapters registered in Redis are loaded into vLLM on
// demand, once, and the least recently used is evicted at --max-loras.
func TestVLLMEngineLoRA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rd, store := startStore(t)
	for _, name := range []string{"lora-a", "lora-b"} {
		if err := store.PutModel(ctx, registry.Model{Name: name, Base: "llama-8b", Path: "/adapters/" + name}); err != nil {
			t.Fatal(err)
		}
	}
	eng := startSimServer(t, func(c *program.SimServerConfig) { c.Sim.MaxLoras, c.Sim.AdapterLoadTime = 1, 200*time.Millisecond })
	d := startDev(t, vllmEngine(eng.URL()), func(c *program.DevConfig) { c.Redis.URL, c.Engine.MaxLoras = rd.URL, 1 })
	beats := logBeats(t, d.NATSURL)
	served := func() string {
		resp, err := http.Get(eng.URL() + "/v1/models")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Concurrent first requests: one load.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			checkStream(t, post(t, d.URL, "/v1/completions", fmt.Sprintf(`{"model":"lora-a","stream":true,"max_tokens":4,"prompt":"p%d"}`, i)), false, 1, false)
		}()
	}
	wg.Wait()
	if n := beats.loads("lora-a"); n != 1 {
		t.Fatalf("4 concurrent first requests caused %d loads", n)
	}
	if !strings.Contains(served(), `"id":"lora-a"`) {
		t.Fatalf("vLLM does not list the loaded adapter: %s", served())
	}
	checkStream(t, post(t, d.URL, "/v1/completions", `{"model":"lora-a","stream":true,"max_tokens":4,"prompt":"again"}`), false, 1, false)
	if n := beats.loads("lora-a"); n != 1 {
		t.Fatalf("a request for a loaded adapter loaded it again (%d loads)", n)
	}
	// A second adapter with one slot: lora-a is evicted from vLLM.
	checkStream(t, post(t, d.URL, "/v1/completions", `{"model":"lora-b","stream":true,"max_tokens":4,"prompt":"b"}`), false, 1, false)
	if m := served(); !strings.Contains(m, `"id":"lora-b"`) || strings.Contains(m, `"id":"lora-a"`) {
		t.Fatalf("after loading lora-b with one slot, vLLM serves %s", m)
	}
}

// TestVLLMChildProcess: --vllm-cmd starts the engine as a child process,
// waits for its health, and restarts it when it dies.
func TestVLLMChildProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and runs it as vLLM")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	port := testenv.FreePort(t)
	cmd := fmt.Sprintf("%s sim-server --port %d --model llama-8b --sim-decode-base 1ms", bin, port)
	d := startDev(t, vllmEngine(""), func(c *program.DevConfig) { c.Engine.VLLMCmd, c.Engine.StartTimeout = cmd, 30*time.Second })
	complete := func() error {
		s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`)
		if s.Status != 200 {
			return fmt.Errorf("status %d: %s", s.Status, s.Body)
		}
		return nil
	}
	if err := complete(); err != nil {
		t.Fatal(err)
	}
	pattern := fmt.Sprintf("sim-server --port %d", port)
	out, err := exec.Command("pgrep", "-f", pattern).Output()
	if err != nil {
		t.Fatalf("the child engine is not running: %v", err)
	}
	pid := strings.Fields(string(out))[0]
	if err := exec.Command("kill", "-9", pid).Run(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		out, _ := exec.Command("pgrep", "-f", pattern).Output()
		if f := strings.Fields(string(out)); len(f) == 0 || f[0] == pid {
			return fmt.Errorf("not restarted yet")
		}
		return complete()
	})
	d.stop()
	if out, err := exec.Command("pgrep", "-f", pattern).Output(); err == nil {
		t.Fatalf("the child engine outlived tokenbus: %s", out)
	}
}
