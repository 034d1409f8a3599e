package program

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// closeFromServer makes the NATS server close nc for a protocol error, the
// way a subject longer than its control line once made it close a
// gateway's: nats.go then gives the connection up for good.
func closeFromServer(t *testing.T, nc *nats.Conn) {
	t.Helper()
	_ = nc.Publish(strings.Repeat("x", 5000), nil)
	_ = nc.Flush()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !nc.IsClosed() {
			return fmt.Errorf("the server has not closed the connection yet")
		}
		return nil
	})
	if err := nc.LastError(); err == nil || !strings.Contains(err.Error(), "control line") {
		t.Fatalf("closed, but not by the server's protocol error: %v", err)
	}
}

// readyCode is /ready's status and body.
func readyCode(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/ready")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// drainStream reads a stream to its end and says how it ended: "done" after
// [DONE], "error" after an error event, "cut" when the connection ended
// without either.
func drainStream(r *bufio.Reader) string {
	end := "cut"
	for {
		line, err := r.ReadString('\n')
		switch {
		case strings.HasPrefix(line, "data: [DONE]") && end == "cut":
			end = "done"
		case strings.HasPrefix(line, `data: {"error"`):
			end = "error"
		}
		if err != nil {
			return end
		}
	}
}

// The server closes the gateway's connection for a protocol error while
// streams run, then goes away for a while: the gateway process stays up,
// /ready answers 503 bus_unavailable meanwhile, every open stream ends with an
// error event (none hangs), and once NATS is back the gateway serves on a
// new connection (counted in tokenbus_nats_connection_restarts_total).
// Before, the gateway exited ("responses runner: stopped while the program
// was running"). Then the same for the worker and the dispatcher.
func TestProgramsOutliveAConnectionTheServerClosed(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	ctx0 := context.Background()
	port, dir := testenv.FreePort(t), t.TempDir()
	ns := natsOn(t, port, dir)
	start := time.Now()
	phase := func(what string) { t.Logf("%5.1fs %s", time.Since(start).Seconds(), what) }
	dc := DefaultDispatcher()
	dc.NATS.URL, dc.Redis.URL, dc.Metrics = ns.ClientURL(), "", "127.0.0.1:0"
	d, err := StartDispatcher(ctx0, dc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	w := simWorker(t, ns, "w1", func(c *WorkerConfig) { c.Worker.DrainTimeout = time.Second })
	gw := plainGateway(t, ns, func(c *GatewayConfig) { c.HTTP.ShutdownTimeout = time.Second })
	testenv.WaitFor(t, 10*time.Second, fleetLen(gw, 1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var streams []*bufio.Reader
	for range 6 {
		streams = append(streams, openStream(t, ctx, gw.Addr(), 5000))
	}
	ends := make(chan string, len(streams))
	for _, r := range streams {
		go func() { ends <- drainStream(r) }()
	}

	phase("streams open")
	old := gw.run()
	closeFromServer(t, old.nc)
	phase("the gateway's connection closed")
	ns.Shutdown() // and NATS is away for a while: no new connection yet
	ns.WaitForShutdown()
	for range 3 {
		code, body := readyCode(gw.Addr())
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "bus_unavailable") {
			t.Fatalf("/ready while the gateway has no connection: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-gw.Done():
		t.Fatalf("the gateway ended: %v", gw.Wait())
	default:
	}

	ns = natsOn(t, port, dir)
	phase("NATS back")
	testenv.WaitFor(t, 30*time.Second, func() error {
		if code, body := readyCode(gw.Addr()); code != 200 {
			return fmt.Errorf("/ready %d %s", code, body)
		}
		return nil
	})
	phase("ready")
	if gw.run() == old {
		t.Fatal("ready again on the connection the server closed")
	}
	if code, body, _ := chat(t, gw.Addr()); code != 200 {
		t.Fatalf("after the restart: %d %s", code, body)
	}
	got := map[string]int{}
	for range streams {
		select {
		case e := <-ends:
			got[e]++
		case <-time.After(30 * time.Second):
			t.Fatalf("a stream open when the connection was closed never ended (so far %v)", got)
		}
	}
	select {
	case <-gw.Done():
		t.Fatalf("the gateway ended: %v", gw.Wait())
	default:
	}
	if got["error"] != len(streams) {
		t.Errorf("the open streams ended %v, want every one with an error event", got)
	}
	phase("streams ended")
	if m := get200(t, "http://"+gw.Addr()+"/metrics"); !strings.Contains(m, `tokenbus_nats_connection_restarts_total{program="gateway"} 1`) {
		t.Errorf("restart not counted:\n%s", grepLines(m, "tokenbus_nats_connection_restarts"))
	}

	// The worker: the same id and engine on a new connection.
	oldW := w.run()
	closeFromServer(t, oldW.nc)
	testenv.WaitFor(t, 15*time.Second, func() error {
		if w.run() == oldW {
			return fmt.Errorf("the worker has not started again")
		}
		if code, body, _ := chat(t, gw.Addr()); code != 200 {
			return fmt.Errorf("chat: %d %s", code, body)
		}
		return nil
	})
	phase("the worker serves again")
	if w.ID() != "w1" {
		t.Errorf("the worker came back as %q", w.ID())
	}
	// The standalone dispatcher.
	oldD := d.run()
	closeFromServer(t, oldD.nc)
	testenv.WaitFor(t, 15*time.Second, func() error {
		if d.run() == oldD {
			return fmt.Errorf("the dispatcher has not started again")
		}
		return nil
	})
	phase("the dispatcher serves again")
	if m := get200(t, "http://"+d.Addr()+"/metrics"); !strings.Contains(m, `tokenbus_nats_connection_restarts_total{program="dispatcher"} 1`) {
		t.Errorf("dispatcher restart not counted:\n%s", grepLines(m, "tokenbus_nats_connection_restarts"))
	}
	for name, done := range map[string]<-chan struct{}{"gateway": gw.Done(), "worker": w.Done(), "dispatcher": d.Done()} {
		select {
		case <-done:
			t.Errorf("the %s ended", name)
		default:
		}
	}
	for name, p := range map[string]interface{ Close() error }{"gateway": gw, "worker": w, "dispatcher": d} {
		if err := p.Close(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		phase(name + " closed")
	}
}

// In dev every program has its own connection to the embedded server; each
// outlives the server closing it, the gateway following a dispatcher that
// started again.
func TestDevOutlivesConnectionsTheServerClosed(t *testing.T) {
	cfg := DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "", "127.0.0.1:-1"
	fast(&cfg.Engine)
	d, err := StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ok := func() error {
		// A keep-alive connection of a run that ended is closed under it:
		// a fresh connection each time.
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}).Post(
			"http://"+d.Addr()+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"llama-8b","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("chat: %d %s", resp.StatusCode, b)
		}
		return nil
	}
	testenv.WaitFor(t, 10*time.Second, ok)
	for _, c := range []struct {
		name string
		nc   func() *nats.Conn
	}{
		{"gateway", func() *nats.Conn { return d.gateway.run().nc }},
		{"dispatcher", func() *nats.Conn { return d.dispatcher.run().nc }},
		{"dev-worker-1", func() *nats.Conn { return d.workers[0].run().nc }},
	} {
		old := c.nc()
		closeFromServer(t, old)
		testenv.WaitFor(t, 15*time.Second, func() error {
			if c.nc() == old {
				return fmt.Errorf("%s still on the closed connection", c.name)
			}
			return ok()
		})
		select {
		case <-d.Done():
			t.Fatalf("dev ended after the %s's connection was closed: %v", c.name, d.Wait())
		default:
		}
	}
	// One /metrics for dev's programs: each counts its own restarts (the
	// gateway's second is the dispatcher's).
	testenv.WaitFor(t, 10*time.Second, func() error {
		m := get200(t, "http://"+d.Addr()+"/metrics")
		for _, want := range []string{`tokenbus_nats_connection_restarts_total{program="gateway"} 2`,
			`tokenbus_nats_connection_restarts_total{program="dispatcher"} 1`,
			`tokenbus_nats_connection_restarts_total{program="dev-worker-1"} 1`,
			`tokenbus_nats_connection_restarts_total{program="dev-worker-2"} 0`} {
			if !strings.Contains(m, want) {
				return fmt.Errorf("no %s in:\n%s", want, grepLines(m, "tokenbus_nats_connection_restarts"))
			}
		}
		return nil
	})
}
