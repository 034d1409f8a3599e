package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/schemas"
)

// TestThirdPartySimDisaggregated: a tokenbus prefill worker and decode
// worker, each in front of an instance of llm-d-inference-sim (a
// third-party vLLM simulator that speaks kv_transfer_params: with
// do_remote_decode it answers as a prefill, with do_remote_prefill its time
// to first token is the KV-transfer latency it is given instead of its
// prefill time). A disaggregated request succeeds, and the decode
// instance's own metrics show the remote prefill: its TTFT is the transfer
// latency (700 ms), not its prefill (200 ms). scripts/llmd-sim builds the
// simulator and runs this test; without TOKENBUS_TEST_LLMD_SIM it skips
// (the build takes minutes: not part of scripts/test).
func TestThirdPartySimDisaggregated(t *testing.T) {
	bin := os.Getenv("TOKENBUS_TEST_LLMD_SIM")
	if bin == "" {
		t.Skip("TOKENBUS_TEST_LLMD_SIM not set: scripts/llmd-sim builds llm-d-inference-sim and runs this test")
	}
	const model = "pd-sim-model"
	sim := func(name string, args ...string) string {
		port := testenv.FreePort(t)
		a := append([]string{"--port", fmt.Sprint(port), "--model", model, "--force-dummy-tokenizer", "--mode", "random",
			"--time-to-first-token", "200ms", "--inter-token-latency", "10ms", "--log-http"}, args...)
		cmd := exec.Command(bin, a...)
		cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		waitPath(t, url, "/health")
		return url
	}
	prefillURL := sim("prefill")
	decodeURL := sim("decode", "--kv-cache-transfer-latency", "700ms")

	d := startDev(t, func(c *program.DevConfig) {
		c.SimWorkers = 0
		c.Dispatcher.Disagg.MinPromptTokens = 1
	})
	hb := watchHeartbeats(t, d.NATSURL)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	var decodeMetrics string
	for _, w := range []struct{ id, role, url string }{{"p", schemas.RolePrefill, prefillURL}, {"d", schemas.RoleDecode, decodeURL}} {
		wcfg := program.DefaultWorker()
		wcfg.NATS, wcfg.Worker.ID, wcfg.Worker.Role, wcfg.Log = natsconn.Options{URL: d.NATSURL}, w.id, w.role, log
		wcfg.Engine.Kind, wcfg.Engine.URL, wcfg.Engine.Model, wcfg.Metrics = "vllm", w.url, model, "127.0.0.1:0"
		wk, err := program.StartWorker(ctx, wcfg)
		if err != nil {
			t.Fatalf("worker %s: %v", w.id, err)
		}
		if w.id == "d" {
			decodeMetrics = "http://" + wk.Addr() + "/metrics"
		}
		t.Cleanup(func() { _ = wk.Close() })
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		if p, dw := hb.last["p"], hb.last["d"]; !p.Healthy || !dw.Healthy || p.Role != schemas.RolePrefill {
			return fmt.Errorf("workers not up: %+v", hb.last)
		}
		return nil
	})

	c := openaiClient(d.URL + "/v1")
	start := time.Now()
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello from the tokenbus P/D test, please answer briefly.")}})
	var ttft time.Duration
	var text strings.Builder
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			if ttft == 0 {
				ttft = time.Since(start)
			}
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := st.Err(); err != nil || text.Len() == 0 {
		t.Fatalf("stream: %q, %v", text.String(), err)
	}
	t.Logf("disaggregated over llm-d-inference-sim: TTFT %v, %q", ttft.Round(time.Millisecond), text.String())
	// The prefill instance answered a prefill for a remote decode...
	if v := metricValue(t, prefillURL, `vllm:request_success_total{finish_reason="remote_decode",model_name="`+model+`"}`); v != 1 {
		t.Errorf("prefill instance's remote_decode requests: %v, want 1", v)
	}
	// ...and the decode instance took the remote prefill: its time to
	// first token is the transfer latency, not its prefill time.
	if n := metricValue(t, decodeURL, `vllm:time_to_first_token_seconds_count{model_name="`+model+`"}`); n != 1 {
		t.Fatalf("decode instance's TTFT count %v, want 1", n)
	}
	if s := metricValue(t, decodeURL, `vllm:time_to_first_token_seconds_sum{model_name="`+model+`"}`); s < 0.6 {
		t.Errorf("decode instance's TTFT %v s: not the 0.7 s KV-transfer latency of a remote prefill", s)
	}
	if ttft < 700*time.Millisecond+200*time.Millisecond {
		t.Errorf("TTFT %v: less than the prefill's 200 ms and the transfer's 700 ms", ttft)
	}
	if v := metricSum(t, decodeMetrics, "tokenbus_worker_remote_prefills_total", `outcome="ok"`); v != 1 {
		t.Errorf("remote prefills ok: %v", v)
	}
}
