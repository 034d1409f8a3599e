package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// /ready from the real catalog over a fleet: a worker that heartbeats with
// an unhealthy engine (or draining, or serving nothing) does not make the
// gateway ready; a healthy one serving a model does.
func TestReadyNeedsAServingWorker(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t))
	for _, tc := range []struct {
		name  string
		hb    schemas.Heartbeat
		ready bool
	}{
		{"engine unhealthy", schemas.Heartbeat{Models: []string{"m"}}, false},
		{"draining", schemas.Heartbeat{Models: []string{"m"}, Healthy: true, Draining: true}, false},
		{"no model", schemas.Heartbeat{Healthy: true}, false},
		{"serving", schemas.Heartbeat{Models: []string{"m"}, Healthy: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := fleet.New()
			tc.hb.Worker, tc.hb.MaxConcurrency = "w1", 4
			fl.Observe(tc.hb, time.Now())
			g := New(Config{}, nil, NewCatalog(fl, nil), nc, nil, nil)
			resp, err := g.App().Test(httptest.NewRequest(http.MethodGet, "/ready", nil))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if got := resp.StatusCode == http.StatusOK; got != tc.ready {
				t.Fatalf("/ready %d %s, want ready %v", resp.StatusCode, b, tc.ready)
			}
		})
	}
}

// With ReadyWithoutWorkers (pools scaled to zero, docs/capacity.md) a
// gateway with no worker is ready: the request that starts one must reach
// it. Without NATS it is not.
func TestReadyWithoutWorkers(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t))
	for _, tc := range []struct {
		name     string
		without  bool
		wantCode int
	}{
		{"default", false, http.StatusServiceUnavailable},
		{"ready without workers", true, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(Config{ReadyWithoutWorkers: tc.without}, nil, NewCatalog(fleet.New(), nil), nc, nil, nil)
			resp, err := g.App().Test(httptest.NewRequest(http.MethodGet, "/ready", nil))
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := io.ReadAll(resp.Body); resp.StatusCode != tc.wantCode {
				t.Fatalf("/ready with no worker: %d %s, want %d", resp.StatusCode, b, tc.wantCode)
			}
		})
	}
	nc.Close()
	g := New(Config{ReadyWithoutWorkers: true}, nil, NewCatalog(fleet.New(), nil), nc, nil, nil)
	resp, err := g.App().Test(httptest.NewRequest(http.MethodGet, "/ready", nil))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/ready without NATS: %d, want 503", resp.StatusCode)
	}
}
