package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func TestHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.Write([]byte(`{"status":"ok"}`))
			return
		}
		http.Error(w, "no worker", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"http", srv.URL + "/health"}, &out, noenv); err != nil {
		t.Fatalf("healthy endpoint: %v", err)
	}
	err := run(context.Background(), []string{"http", "--timeout", "1s", srv.URL + "/ready"}, &out, noenv)
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503 endpoint: got %v, want an error naming 503", err)
	}
	// Nothing serving: a listener held by the test that resets connections
	// (a port merely closed may be another program's by the time it is dialed).
	if err := run(context.Background(), []string{"http", "--timeout", "300ms", "http://" + testenv.ResetListener(t).Addr + "/health"}, &out, noenv); err == nil {
		t.Fatal("no server: want an error")
	}
}

func TestHeartbeat(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	host, _ := os.Hostname()
	beat := func(id string, healthy bool, stop <-chan struct{}) {
		b, _ := json.Marshal(schemas.Heartbeat{Worker: id, Healthy: healthy, MaxConcurrency: 8})
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				_ = nc.Publish(schemas.HeartbeatSubject(id), b)
			}
		}
	}
	stop := make(chan struct{})
	defer close(stop)
	go beat("w-explicit", true, stop)
	go beat(schemas.SafeToken(host)+"-abc123", false, stop)
	go beat("someone-else", true, stop)

	env := map[string]string{"TOKENBUS_NATS_URL": ns.ClientURL()}
	getenv := func(k string) string { return env[k] }
	ctx := context.Background()
	var out bytes.Buffer

	if err := run(ctx, []string{"heartbeat", "--id", "w-explicit", "--timeout", "2s"}, &out, getenv); err != nil {
		t.Fatalf("explicit id: %v", err)
	}
	env["TOKENBUS_ID"] = "w-explicit"
	if err := run(ctx, []string{"heartbeat", "--timeout", "2s"}, &out, getenv); err != nil {
		t.Fatalf("id from TOKENBUS_ID: %v", err)
	}
	delete(env, "TOKENBUS_ID")
	if err := run(ctx, []string{"heartbeat", "--timeout", "2s"}, &out, getenv); err != nil {
		t.Fatalf("host-name default id: %v", err)
	}
	if err := run(ctx, []string{"heartbeat", "--timeout", "500ms", "--require-healthy"}, &out, getenv); err == nil ||
		!strings.Contains(err.Error(), "unhealthy") {
		t.Fatalf("unhealthy engine with --require-healthy: got %v", err)
	}
	if err := run(ctx, []string{"heartbeat", "--id", "nobody", "--timeout", "300ms"}, &out, getenv); err == nil {
		t.Fatal("absent worker: want an error")
	}
	env["TOKENBUS_NATS_URL"] = "nats://" + testenv.ResetListener(t).Addr
	if err := run(ctx, []string{"heartbeat", "--id", "w-explicit", "--timeout", "300ms"}, &out, getenv); err == nil {
		t.Fatal("no NATS: want an error")
	}
}

func noenv(string) string { return "" }
