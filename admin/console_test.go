package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/admin"
)

// The console's files need no token (they hold no data); its config and
// everything else do.
func TestConsoleFiles(t *testing.T) {
	w := newWorld(t, func(c *admin.Config) { c.APIAddr, c.APIAuth = "127.0.0.1:9999", true })
	for _, tc := range []struct {
		path, ctype, has string
		status           int
	}{
		{"/console/", "text/html; charset=utf-8", `<script type="module" src="app.js">`, 200},
		{"/console/index.html", "text/html; charset=utf-8", "Admin token", 200},
		{"/console/app.js", "text/javascript; charset=utf-8", "takeFragmentToken", 200},
		{"/console/pages/playground.js", "text/javascript; charset=utf-8", "/v1/chat/completions", 200},
		{"/console/style.css", "text/css; charset=utf-8", "@media", 200},
		{"/console/nope.js", "application/json", "unknown_url", 404},
		{"/console/pages/../app.js", "", "", 0}, // cleaned by the client or refused: never outside the folder
	} {
		r := w.doAuth("GET", tc.path, "", "")
		if tc.status == 0 {
			if r.status == 200 && !strings.Contains(r.body, "takeFragmentToken") {
				t.Errorf("%s: %d %s", tc.path, r.status, r.body)
			}
			continue
		}
		if r.status != tc.status || r.header.Get("Content-Type") != tc.ctype || !strings.Contains(r.body, tc.has) {
			t.Errorf("GET %s: %d %q, want %d %q with %q: %.200s", tc.path, r.status, r.header.Get("Content-Type"), tc.status, tc.ctype, tc.has, r.body)
		}
		if tc.status == 200 && !strings.Contains(r.header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("GET %s: CSP %q", tc.path, r.header.Get("Content-Security-Policy"))
		}
	}
	if r := w.doAuth("GET", "/console", "", ""); r.status != 200 { // the client followed the redirect
		t.Errorf("GET /console: %d", r.status)
	}
	w.doAuth("GET", "/console/config", "", "").expect(t, "config without the token", 401, "invalid_admin_token", "")
	var cfg map[string]any
	w.do("GET", "/console/config", "").expect(t, "config", 200, "", "").decode(t, &cfg)
	if cfg["api_addr"] != "127.0.0.1:9999" || cfg["api_auth"] != true || cfg["batches"] != false {
		t.Errorf("config %v", cfg)
	}
	w.do("GET", "/batches/batch_x/output", "").expect(t, "batch output without batches", 503, "batches_unavailable", "")
	w.do("POST", "/batches/batch_x/cancel", "").expect(t, "batch cancel without batches", 503, "batches_unavailable", "")
}

// GET /events/traffic streams one event a second from the registry and the
// worker table; it needs the token.
func TestTrafficStream(t *testing.T) {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokenbus_gateway_requests_total"}, []string{"route", "model", "status"})
	reg.MustRegister(requests)
	w := newWorld(t, func(c *admin.Config) { c.Metrics = reg })
	w.worker("w1", []string{"m"}, nil, false, false)
	w.doAuth("GET", "/events/traffic", "", "").expect(t, "traffic without the token", 401, "invalid_admin_token", "")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", w.url+"/events/traffic", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var events []map[string]any
	for len(events) < 2 && sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		events = append(events, e)
		requests.WithLabelValues("/v1/completions", "m", "500").Add(4) // counted in the next event
	}
	if len(events) < 2 {
		t.Fatalf("events %v: %v", events, sc.Err())
	}
	e := events[1]
	if e["workers"] != 1.0 || e["running"] != 1.0 || e["requests_per_s"].(float64) <= 0 || e["errors"].(map[string]any)["500"] != 4.0 {
		t.Fatalf("second event %v; want 1 worker running 1, 4 requests with status 500", e)
	}
	if e["ttft_p50_ms"] != nil {
		t.Fatalf("ttft with no observations: %v", e["ttft_p50_ms"])
	}
}

// Shutdown ends open traffic streams rather than waiting for their clients.
func TestTrafficStreamShutdown(t *testing.T) {
	w := newWorld(t, func(c *admin.Config) { c.Metrics = prometheus.NewRegistry() })
	req, _ := http.NewRequest("GET", w.url+"/events/traffic", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // the stream is open
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a traffic stream open: %v", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("the stream did not end cleanly: %v", err)
	}
}
