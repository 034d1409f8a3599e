package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/schemas"
)

// last is worker's latest heartbeat (ok false: none yet).
func (l *beatLog) last(worker string) (schemas.Heartbeat, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.beats[worker]
	if len(b) == 0 {
		return schemas.Heartbeat{}, false
	}
	return b[len(b)-1], true
}

// isSleeping is the sim-server's GET /is_sleeping, as vLLM answers it.
func isSleeping(t *testing.T, s *simServer) bool {
	t.Helper()
	var v struct {
		IsSleeping bool `json:"is_sleeping"`
	}
	if st, _, err := httpJSON(http.MethodGet, s.URL()+"/is_sleeping", "", nil, &v); err != nil || st != 200 {
		t.Fatalf("GET /is_sleeping: %d %v", st, err)
	}
	return v.IsSleeping
}

// TestSleepingEngine: a worker with --sleep-after in front of a vLLM with
// sleep mode (tokenbus sim-server, its wake-up 400 ms) puts it to sleep once
// idle; the next request, through the gateway and the official Go SDK,
// wakes it and succeeds, its time to first token the wake-up and a normal
// one. Beside an awake worker, requests go to the awake one while it has
// room, and to the sleeping one (waking it) when it has none.
func TestSleepingEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: sleeps and wakes an engine, ~4 s")
	}
	t.Parallel()
	ctx := context.Background()
	const after, wake = 300 * time.Millisecond, 400 * time.Millisecond
	eng := startSimServer(t, func(c *program.SimServerConfig) {
		c.DevMode, c.SleepMode = true, true // VLLM_SERVER_DEV_MODE=1, --enable-sleep-mode
		c.Sim.SleepTime, c.Sim.WakeTime = 20*time.Millisecond, wake
	})
	d := startDev(t, func(c *program.DevConfig) { c.SimWorkers = 0 })
	beats := logBeats(t, d.NATSURL)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	startWorker := func(id string, configure func(*program.WorkerConfig)) {
		t.Helper()
		wcfg := program.DefaultWorker()
		wcfg.NATS, wcfg.Worker.ID, wcfg.Log = natsconn.Options{URL: d.NATSURL}, id, log
		configure(&wcfg)
		wk, err := program.StartWorker(ctx, wcfg)
		if err != nil {
			t.Fatalf("worker %s: %v", id, err)
		}
		t.Cleanup(func() { _ = wk.Close() })
	}
	startWorker("sleepy", func(c *program.WorkerConfig) {
		c.Engine.Kind, c.Engine.URL, c.Worker.SleepAfter = "vllm", eng.URL(), after
	})
	waitReady(t, d.URL)
	asleep := func() {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, func() error {
			if hb, ok := beats.last("sleepy"); !ok || !hb.Sleeping || !isSleeping(t, eng) {
				return fmt.Errorf("not asleep: heartbeat %+v", hb)
			}
			return nil
		})
	}
	asleep()

	// The next request wakes it: its first token comes after the wake-up.
	c := openaiClient(d.URL + "/v1")
	start := time.Now()
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "llama-8b", MaxTokens: openai.Int(5),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("wake up")},
	})
	var ttft time.Duration
	chunks := 0
	for st.Next() {
		if ttft == 0 {
			ttft = time.Since(start)
		}
		chunks++
	}
	if err := st.Err(); err != nil || chunks == 0 {
		t.Fatalf("the request that wakes the engine: %d chunks, %v", chunks, err)
	}
	var hb schemas.Heartbeat
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb, _ = beats.last("sleepy"); hb.WakeMS == 0 {
			return fmt.Errorf("no wake_ms in %+v", hb)
		}
		return nil
	})
	wakeTook := time.Duration(hb.WakeMS) * time.Millisecond
	if wakeTook < wake || ttft < wakeTook || ttft > wakeTook+2*time.Second {
		t.Fatalf("time to first token %v, the wake-up %v (the engine's %v): want the wake-up and a normal first token", ttft, wakeTook, wake)
	}
	t.Logf("time to first token %v, of which the wake-up %v", ttft, wakeTook)
	asleep()

	// An awake worker (the sim, two requests at a time: one request after
	// another never fills it, even when its done notice comes after the
	// answer) takes every request it has room for: the sleeping engine
	// serves none and stays asleep.
	startWorker("awake", func(c *program.WorkerConfig) { c.Worker.MaxConcurrency = 2 })
	testenv.WaitFor(t, 5*time.Second, func() error {
		if _, ok := beats.last("awake"); !ok {
			return fmt.Errorf("no heartbeat of the awake worker")
		}
		return nil
	})
	asleep()
	served := eng.metric("vllm:request_success_total")
	for i := range 6 {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model: openai.CompletionNewParamsModel("llama-8b"), MaxTokens: openai.Int(3),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprint("request ", i))},
		})
		if err != nil || resp.Choices[0].Text == "" {
			t.Fatalf("request %d: %+v %v", i, resp, err)
		}
	}
	if n := eng.metric("vllm:request_success_total"); n != served || !isSleeping(t, eng) {
		t.Fatalf("the sleeping engine served %v requests (asleep now: %v) beside an awake worker with room", n-served, isSleeping(t, eng))
	}

	// The awake worker full (two long streams): the next request goes to
	// the sleeping one, which wakes for it.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":300,"ignore_eos":true,"messages":[{"role":"user","content":"a long one"}]}`); s.Status != 200 {
				t.Errorf("a long stream: %d %s", s.Status, s.Body)
			}
		}()
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb, _ := beats.last("awake"); hb.Running != 2 {
			return fmt.Errorf("the awake worker runs %d", hb.Running)
		}
		return nil
	})
	if s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"no room"}`); s.Status != 200 {
		t.Fatalf("with the awake worker full: %d %s", s.Status, s.Body)
	}
	if n := eng.metric("vllm:request_success_total"); n != served+1 {
		t.Fatalf("the sleeping engine served %v requests, want the one the awake worker had no room for", n-served)
	}
	wg.Wait()
}

// TestSleepingEngineChild: `tokenbus worker --engine vllm --sleep-after`
// with `--vllm-cmd "tokenbus sim-server ... --enable-sleep-mode"`: the
// child gets VLLM_SERVER_DEV_MODE=1 (so it serves the sleep routes), is put
// to sleep when idle and woken by a request; a command without
// --enable-sleep-mode is refused at start.
func TestSleepingEngineChild(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and runs it as vLLM")
	}
	t.Parallel()
	ctx := context.Background()
	bin := tokenbusBinary(t)
	port := testenv.FreePort(t)
	d := startDev(t, func(c *program.DevConfig) { c.SimWorkers = 0 })
	beats := logBeats(t, d.NATSURL)
	wcfg := program.DefaultWorker()
	wcfg.NATS, wcfg.Worker.ID, wcfg.Worker.SleepAfter = natsconn.Options{URL: d.NATSURL}, "child", 300*time.Millisecond
	wcfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	wcfg.Engine.Kind, wcfg.Engine.StartTimeout = "vllm", 30*time.Second
	wcfg.Engine.VLLMCmd = fmt.Sprintf("%s sim-server --port %d --model llama-8b --sim-wake-time 200ms", bin, port)
	if _, err := program.StartWorker(ctx, wcfg); err == nil || !strings.Contains(err.Error(), "--enable-sleep-mode") {
		t.Fatalf("a --vllm-cmd without --enable-sleep-mode: %v", err)
	}
	wcfg.Engine.VLLMCmd += " --enable-sleep-mode"
	wk, err := program.StartWorker(ctx, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })
	waitReady(t, d.URL)
	child := &simServer{t: t, cfg: program.SimServerConfig{Listen: fmt.Sprintf("127.0.0.1:%d", port)}}
	testenv.WaitFor(t, 10*time.Second, func() error {
		if hb, ok := beats.last("child"); !ok || !hb.Sleeping || !isSleeping(t, child) {
			return fmt.Errorf("not asleep: %+v", hb)
		}
		return nil
	})
	if s := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"wake up"}`); s.Status != 200 || s.Elapsed < 200*time.Millisecond {
		t.Fatalf("the request that wakes the child: %d in %v: %s", s.Status, s.Elapsed, s.Body)
	}
}
