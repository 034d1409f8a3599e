package program

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

// In dev, a request goes from the dispatcher to the worker, and its
// stream's frames from the worker to the gateway, in memory: the client gets
// every chunk and the end, and neither the worker's work subject nor the
// gateway's inbox on the bus carries any of it.
func TestDevInMemory(t *testing.T) {
	cfg := DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "", "127.0.0.1:-1"
	fast(&cfg.Engine)
	d, err := StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	nc, err := nats.Connect(d.NATSURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var onBus atomic.Int64
	for _, subject := range []string{d.gateway.run().cl.Prefix() + ">", schemas.WorkPrefix + ">"} {
		if _, err := nc.Subscribe(subject, func(*nats.Msg) { onBus.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+d.Addr()+"/v1/chat/completions", strings.NewReader(
		`{"model":"llama-8b","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	chunks, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		switch line := sc.Text(); {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: {"):
			chunks++
		}
	}
	if err := sc.Err(); err != nil || !done || chunks < 16 {
		t.Fatalf("%d chunks, [DONE] %v, read error %v", chunks, done, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := onBus.Load(); n > 0 {
		t.Fatalf("%d messages to the worker or the gateway's inbox on the bus, want none", n)
	}
}
