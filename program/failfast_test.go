package program

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tokenbus/tokenbus/internal/embedded"
	"github.com/tokenbus/tokenbus/internal/testenv"
)

// simWorker starts a worker with the default (real-paced) sim on ns.
func simWorker(t *testing.T, ns *server.Server, id string, configure ...func(*WorkerConfig)) *Worker {
	t.Helper()
	wc := DefaultWorker()
	wc.NATS.URL, wc.Worker.ID = ns.ClientURL(), id
	for _, c := range configure {
		c(&wc)
	}
	w, err := StartWorker(context.Background(), wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// plainGateway starts a gateway (embedded dispatcher, no Redis) on ns.
func plainGateway(t *testing.T, ns *server.Server, configure ...func(*GatewayConfig)) *Gateway {
	t.Helper()
	gc := DefaultGateway()
	gc.NATS.URL, gc.Redis.URL = ns.ClientURL(), ""
	gc.HTTP.Listen, gc.HTTP.Auth, gc.HTTP.Admin = "127.0.0.1:0", false, ""
	for _, c := range configure {
		c(&gc)
	}
	gw, err := StartGateway(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return gw
}

// openStream posts a streaming chat request for n tokens and returns the
// body once its first chunk has come.
func openStream(t *testing.T, ctx context.Context, addr string, n int) *bufio.Reader {
	t.Helper()
	body := `{"model":"llama-8b","stream":true,"max_tokens":` + strconv.Itoa(n) + `,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before its first chunk: %v", err)
		}
		if strings.HasPrefix(line, "data: {") {
			return r
		}
	}
}

// fleetLen is a WaitFor condition: gw's fleet has n workers.
func fleetLen(gw *Gateway, n int) func() error {
	return func() error {
		if got := gw.run().workers.Len(); got != n {
			return fmt.Errorf("%d workers in the fleet, want %d", got, n)
		}
		return nil
	}
}

// A worker whose connection drops (kill -9 as NATS sees it) is out of the
// fleet, and every stream it had has ended with stream_lost, within about a
// second: 3 missed 250ms heartbeats plus a sweep, not the 15s stall timeout
// (before: gone after 3s, streams ended after 15s). A request sent then
// goes to the live worker.
func TestDeadWorkerNoticedWithinASecond(t *testing.T) {
	ns := testenv.NATS(t)
	// Its streams cannot drain once its connection is gone: closing it at
	// the test's end need not wait out DrainTimeout (30 s).
	w1 := simWorker(t, ns, "w1", func(c *WorkerConfig) { c.Worker.DrainTimeout = 100 * time.Millisecond })
	// Migration off: this checks that the streams end at once; with it on
	// they continue elsewhere (failover_test.go).
	gw := plainGateway(t, ns, func(c *GatewayConfig) { c.HTTP.MigrationLimit = 0 })
	testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var streams []*bufio.Reader
	for range 5 { // 5000 tokens at ~10ms a step: far longer than the test
		streams = append(streams, openStream(t, ctx, gw.Addr(), 5000))
	}
	simWorker(t, ns, "w2")
	testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 2))

	killed := time.Now()
	w1.run().nc.Close() // no drain, no goodbye: what NATS sees of kill -9
	type end struct {
		after time.Duration
		last  string
	}
	ends := make(chan end, len(streams))
	for _, r := range streams {
		go func() {
			var last string
			for {
				line, err := r.ReadString('\n')
				if strings.HasPrefix(line, "data: {") {
					last = line
				}
				if err != nil {
					ends <- end{time.Since(killed), last}
					return
				}
			}
		}()
	}
	testenv.WaitFor(t, 5*time.Second, fleetLen(gw, 1))
	gone := time.Since(killed)
	t.Logf("w1 out of the fleet %v after its connection closed", gone)
	// The bound: 3 beats of 250ms plus a 100ms sweep, and scheduling slack
	// on a loaded test machine.
	const bound = 1300 * time.Millisecond
	if gone > bound {
		t.Errorf("the dead worker left the fleet after %v, want ≤ %v", gone, bound)
	}
	var slowest time.Duration
	for range streams {
		select {
		case e := <-ends:
			slowest = max(slowest, e.after)
			if !strings.Contains(e.last, "stream_lost") || !strings.Contains(e.last, "w1") {
				t.Errorf("stream of the dead worker ended with %q, want a stream_lost naming w1", e.last)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a stream of the dead worker still runs 5s after the kill")
		}
	}
	t.Logf("its streams ended within %v", slowest)
	if slowest > bound {
		t.Errorf("the dead worker's streams ended %v after the kill, want ≤ %v", slowest, bound)
	}
	// A new request goes to the live worker.
	r := openStream(t, ctx, gw.Addr(), 5)
	for {
		line, err := r.ReadString('\n')
		if strings.Contains(line, "error") {
			t.Fatalf("request after the kill: %s", line)
		}
		if err != nil || strings.HasPrefix(line, "data: [DONE]") {
			break
		}
	}
}

// natsOn starts a NATS server on port (0: any) storing in dir; it stops
// with the test (a second Shutdown is harmless).
func natsOn(t *testing.T, port int, dir string) *server.Server {
	t.Helper()
	ns, err := embedded.NATS("127.0.0.1:"+strconv.Itoa(port), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// chat posts a short non-streaming request and returns its status and body.
func chat(t *testing.T, addr string) (int, string, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama-8b","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start)
}

// With NATS down under a running gateway, a request gets an immediate 503
// bus_unavailable and /ready says not ready (before: every request waited
// 5s for a 503 no_dispatcher); once the server is back on its port,
// requests work again.
func TestNATSDownIsAnImmediate503(t *testing.T) {
	t.Parallel() // ~20 s of its programs' closing after the restart: waited beside other tests
	port, dir := testenv.FreePort(t), t.TempDir()
	ns := natsOn(t, port, dir)
	simWorker(t, ns, "w1")
	gw := plainGateway(t, ns)
	testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 1))
	if code, body, _ := chat(t, gw.Addr()); code != 200 {
		t.Fatalf("before the outage: %d %s", code, body)
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if gw.run().nc.IsConnected() {
			return fmt.Errorf("the gateway still thinks it is connected")
		}
		return nil
	})
	code, body, took := chat(t, gw.Addr())
	if code != 503 || !strings.Contains(body, `"bus_unavailable"`) || took > time.Second {
		t.Errorf("with NATS down: %d %s after %v, want an immediate 503 bus_unavailable", code, body, took)
	}
	if got := get(t, "http://"+gw.Addr()+"/ready"); got != 503 {
		t.Errorf("/ready with NATS down: %d, want 503", got)
	}

	natsOn(t, port, dir)
	back := time.Now()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if code, body, _ := chat(t, gw.Addr()); code != 200 {
			return fmt.Errorf("after NATS came back: %d %s", code, body)
		}
		return nil
	})
	t.Logf("requests work %v after NATS came back", time.Since(back))
}

// A non-streaming reply larger than the server's max_payload reaches the
// client whole: the worker sends it in parts (schemas.FramePart) and the
// client joins them (before: the worker's publish failed, unnoticed, and
// the client waited 15s for a 503).
func TestLargeReplyInParts(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, MaxPayload: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not start")
	}
	wc := DefaultWorker()
	wc.NATS.URL, wc.Worker.ID = ns.ClientURL(), "w1"
	wc.Engine.Sim.DecodeBase, wc.Engine.Sim.PrefillBase, wc.Engine.Sim.DecodePerSeq, wc.Engine.Sim.PrefillPerToken = 0, 0, 0, 0
	w, err := StartWorker(context.Background(), wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	gw := plainGateway(t, ns)
	testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 1))

	start := time.Now()
	resp, err := http.Post("http://"+gw.Addr()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"llama-8b","max_tokens":8000,"n":2,"ignore_eos":true,"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	t.Logf("%d bytes in %v", len(b), time.Since(start))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %.300s", resp.StatusCode, b)
	}
	if len(b) < 64<<10 {
		t.Fatalf("the reply is %d bytes: not over max_payload (32 KiB) enough to test parts", len(b))
	}
	var out struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("reply is not one JSON object: %v", err)
	}
	if len(out.Choices) != 2 || out.Usage.CompletionTokens != 16000 {
		t.Errorf("%d choices, %d completion tokens; want 2 and 16000", len(out.Choices), out.Usage.CompletionTokens)
	}
}
