package program

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// fast makes the sim answer in about a millisecond a step.
func fast(c *EngineConfig) { c.Sim.DecodeBase, c.Sim.PrefillBase = time.Millisecond, time.Millisecond }

// distributed starts a dispatcher, a worker and a gateway (its embedded
// dispatcher on) as separate programs on ns, with no Redis, every listener
// on a port chosen at run time.
func distributed(t *testing.T, ns *server.Server) (*Dispatcher, *Worker, *Gateway) {
	t.Helper()
	ctx := context.Background()
	dc := DefaultDispatcher()
	dc.NATS.URL, dc.Redis.URL, dc.Metrics = ns.ClientURL(), "", "127.0.0.1:0"
	d, err := StartDispatcher(ctx, dc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	wc := DefaultWorker()
	wc.NATS.URL, wc.Metrics, wc.Worker.ID = ns.ClientURL(), "127.0.0.1:0", "w1"
	fast(&wc.Engine)
	w, err := StartWorker(ctx, wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	gc := DefaultGateway()
	gc.NATS.URL, gc.Redis.URL = ns.ClientURL(), ""
	gc.HTTP.Listen, gc.HTTP.Auth, gc.HTTP.Admin = "127.0.0.1:0", false, ""
	gw, err := StartGateway(ctx, gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return d, w, gw
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// boundAddr checks addr is a real host:port (not the configured :0).
func boundAddr(t *testing.T, what, addr string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" || port == "" {
		t.Fatalf("%s Addr() = %q, want the bound address", what, addr)
	}
}

// Each role started on its own: Addr is the bound address, the programs
// serve a request together, and Close is clean and can be called again.
func TestRolesServeAndCloseCleanly(t *testing.T) {
	ns := testenv.NATS(t)
	d, w, gw := distributed(t, ns)
	for _, a := range []struct{ what, addr string }{{"gateway", gw.Addr()}, {"dispatcher", d.Addr()}, {"worker", w.Addr()}} {
		boundAddr(t, a.what, a.addr)
	}
	if gw.AdminAddr() != "" {
		t.Fatalf("admin API on %s with Admin off", gw.AdminAddr())
	}
	for _, url := range []string{"http://" + d.Addr() + "/metrics", "http://" + w.Addr() + "/metrics"} {
		if st := get(t, url); st != 200 {
			t.Fatalf("GET %s: %d", url, st)
		}
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if st := get(t, "http://"+gw.Addr()+"/ready"); st != 200 {
			return fmt.Errorf("/ready %d", st)
		}
		return nil
	})
	resp, err := http.Post("http://"+gw.Addr()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"llama-8b","prompt":"hi","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":3`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}

	for _, p := range []struct {
		name string
		h    interface {
			Close() error
			Wait() error
		}
	}{{"gateway", gw}, {"worker", w}, {"dispatcher", d}} {
		for i := range 2 {
			if err := p.h.Close(); err != nil {
				t.Errorf("%s Close #%d: %v", p.name, i+1, err)
			}
		}
		if err := p.h.Wait(); err != nil {
			t.Errorf("%s Wait after Close: %v", p.name, err)
		}
	}
	// Everything released: no connection left on the server, no listener.
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := ns.NumClients(); n != 0 {
			return fmt.Errorf("%d NATS connections left", n)
		}
		return nil
	})
	if _, err := net.DialTimeout("tcp", gw.Addr(), time.Second); err == nil {
		t.Fatal("the gateway still listens after Close")
	}
}

// A gateway whose listener closes under it has stopped serving: Wait returns
// that, the rest of the program (the embedded dispatcher, the connection)
// ends too.
func TestGatewayServeFailureEndsTheProgram(t *testing.T) {
	ns := testenv.NATS(t)
	gc := DefaultGateway()
	gc.NATS.URL, gc.Redis.URL = ns.ClientURL(), ""
	gc.HTTP.Listen, gc.HTTP.Auth, gc.HTTP.Admin = "127.0.0.1:0", false, ""
	gw, err := StartGateway(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	if st := get(t, "http://"+gw.Addr()+"/health"); st != 200 {
		t.Fatalf("/health %d", st)
	}
	_ = gw.ln.Close()
	werr := waitEnded(t, gw.Done(), gw.Wait)
	if !errors.Is(werr, errStopped) || !strings.HasPrefix(werr.Error(), "gateway: ") {
		t.Fatalf("Wait: %v, want the gateway's", werr)
	}
	if !gw.run().nc.IsClosed() {
		t.Fatal("the NATS connection outlived the program")
	}
	if err := gw.Close(); err != werr {
		t.Fatalf("Close after the failure: %v, want %v", err, werr)
	}
}

// In dev, one failing program ends all of dev: the gateway's listener closes
// under it, and the dispatcher, the workers and the embedded NATS server stop.
func TestDevEndsWhenAPartFails(t *testing.T) {
	cfg := DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:-1"
	cfg.SimWorkers = 2
	fast(&cfg.Engine)
	d, err := StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	boundAddr(t, "dev", d.Addr())
	boundAddr(t, "dev admin", d.AdminAddr())
	if d.AdminToken() == "" || d.Workers() != 2 || strings.Join(d.Models(), ",") != "llama-8b" ||
		strings.Join(d.Adapters(), ",") != "llama-8b-lora" || !strings.HasPrefix(d.StoreURL(), "redis://127.0.0.1:") {
		t.Fatalf("token %q, %d workers, models %v, adapters %v, store %q", d.AdminToken(), d.Workers(), d.Models(), d.Adapters(), d.StoreURL())
	}
	if st := get(t, "http://"+d.Addr()+"/ready"); st != 200 {
		t.Fatalf("/ready %d right after StartDev", st)
	}
	natsURL := d.NATSURL()

	_ = d.gateway.ln.Close()
	werr := waitEnded(t, d.Done(), d.Wait)
	if !errors.Is(werr, errStopped) || !strings.Contains(werr.Error(), "gateway: ") {
		t.Fatalf("Wait: %v, want the gateway's", werr)
	}
	for _, p := range []struct {
		name string
		done <-chan struct{}
	}{{"dispatcher", d.dispatcher.Done()}, {"worker 1", d.workers[0].Done()}, {"worker 2", d.workers[1].Done()}} {
		select {
		case <-p.done:
		default:
			t.Errorf("the %s still runs after dev ended", p.name)
		}
	}
	if nc, err := nats.Connect(natsURL, nats.Timeout(time.Second)); err == nil {
		nc.Close()
		t.Fatal("the embedded NATS server still runs after dev ended")
	}
}

// A worker whose Run fails at once (its id is taken) fails its start with
// Run's error, and leaves nothing behind.
func TestWorkerRunErrorFailsTheStart(t *testing.T) {
	ns := testenv.NATS(t)
	wc := DefaultWorker()
	wc.NATS.URL, wc.Worker.ID = ns.ClientURL(), "twin"
	first, err := StartWorker(context.Background(), wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	second, err := StartWorker(context.Background(), wc)
	if err == nil {
		_ = second.Close()
		t.Fatal("a second worker with the same id started")
	}
	if !strings.Contains(err.Error(), `worker: worker id "twin" is already in use`) {
		t.Fatalf("start: %v", err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := ns.NumClients(); n != 1 {
			return fmt.Errorf("%d NATS connections, want the first worker's only", n)
		}
		return nil
	})
}

// A start that cannot finish gives up with its context, or with its error,
// and releases what it had started.
func TestStartFailures(t *testing.T) {
	ns := testenv.NATS(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	gc := DefaultGateway()
	gc.NATS.URL, gc.Redis.URL = ns.ClientURL(), ""
	gc.HTTP.Listen, gc.HTTP.Auth, gc.HTTP.Admin = taken.Addr().String(), false, ""
	if _, err := StartGateway(context.Background(), gc); err == nil || !strings.Contains(err.Error(), "gateway listen") {
		t.Fatalf("gateway on a taken port: %v", err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := ns.NumClients(); n != 0 {
			return fmt.Errorf("%d NATS connections left by a failed start", n)
		}
		return nil
	})

	gc.HTTP.Auth = true
	if _, err := StartGateway(context.Background(), gc); err == nil || !strings.Contains(err.Error(), "need the store") {
		t.Fatalf("API keys with no store: %v", err)
	}

	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone.Close() // nothing listens there now: NATS is "not up yet", retried for 30s
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	dc := DefaultDispatcher()
	dc.NATS.URL, dc.Redis.URL = "nats://"+gone.Addr().String(), ""
	start := time.Now()
	if _, err := StartDispatcher(ctx, dc); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dispatcher with no NATS: %v, want its context's end", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the start took %s to give up", took)
	}
}

// The sim-server serves on its bound address, closes cleanly, and a new one
// can take the same address at once.
func TestSimServerRestartsOnItsAddress(t *testing.T) {
	cfg := DefaultSimServer()
	cfg.Listen = "127.0.0.1:0"
	s, err := StartSimServer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	boundAddr(t, "sim-server", s.Addr())
	if st := get(t, "http://"+s.Addr()+"/health"); st != 200 {
		t.Fatalf("/health %d", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	cfg.Listen = s.Addr()
	again, err := StartSimServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("restart on %s: %v", cfg.Listen, err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

// waitEnded waits (bounded) for a program to end by itself and returns Wait's error.
func waitEnded(t *testing.T, done <-chan struct{}, wait func() error) error {
	t.Helper()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the program did not end after a part failed")
	}
	err := wait()
	if err == nil {
		t.Fatal("Wait returned nil after a part failed")
	}
	return err
}
