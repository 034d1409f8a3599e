package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// --engine-health-path reaches the engine, from the command line or the
// environment, and a path the server does not serve (404) stops the worker
// within seconds, naming the path, instead of waiting --engine-start-timeout.
// --engine-health-interval 0 sends no probe at all.
func TestEngineHealthFlags(t *testing.T) {
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/custom-health":
			probes.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable) // never healthy: only a probe can tell
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	// NATS: a listener held by the test that resets every connection (the
	// worker retries it until its context ends); a connection to it says
	// the worker got past its engine.
	natsLn := testenv.ResetListener(t)
	base := []string{"worker", "--engine", "openai", "--engine-url", srv.URL, "--nats-url", "nats://" + natsLn.Addr, "--log-level", "error"}
	for _, tc := range []struct {
		name string
		args []string
		env  string
		says string
	}{
		{"flag", []string{"--engine-health-path", "/nope"}, "", "GET /nope"},
		{"env", nil, "/nope", "GET /nope"},
		{"vllm", []string{"--engine", "vllm"}, "", "not vLLM"}, // no /health on this server
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("TOKENBUS_ENGINE_HEALTH_PATH", tc.env)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			start := time.Now()
			err := Run(ctx, append(append([]string{}, base...), tc.args...), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err %v, want a 404 on the health path and %q", err, tc.says)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		// The engine gets ready without a probe; the worker then dials NATS,
		// which resets it: once it has, the worker is stopped.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		before := natsLn.Accepted()
		go func() {
			for ctx.Err() == nil && natsLn.Accepted() == before {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
		}()
		err := Run(ctx, append(append([]string{}, base...), "--engine-health-path", "/custom-health", "--engine-health-interval", "0"), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "connect to NATS") || natsLn.Accepted() == before {
			t.Fatalf("err %v, want the engine ready and NATS failing", err)
		}
		if n := probes.Load(); n != 0 {
			t.Errorf("%d probes with --engine-health-interval 0", n)
		}
	})
}
