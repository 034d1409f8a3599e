package simserver

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// vLLM's sleep routes: only in dev mode (else FastAPI's 404), working only
// with sleep mode (else vLLM's 500); an empty 200 once done; /is_sleeping's
// JSON; asleep, generation is a 503, /health a 200.
func TestSleepRoutes(t *testing.T) {
	sc := fastSim()
	sc.SleepTime, sc.WakeTime = 0, 30*time.Millisecond
	isSleeping := func(url string) bool {
		t.Helper()
		resp := do(t, "GET", url+"/is_sleeping", "")
		b := readAll(t, resp)
		var v map[string]any
		if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || len(v) != 1 {
			t.Fatalf("GET /is_sleeping: %d %s", resp.StatusCode, b)
		}
		asleep, ok := v["is_sleeping"].(bool)
		if !ok {
			t.Fatalf("GET /is_sleeping: %s", b)
		}
		return asleep
	}
	status := func(method, url string) (int, string) {
		t.Helper()
		resp := do(t, method, url, "")
		return resp.StatusCode, string(readAll(t, resp))
	}

	off := start(t, Config{SleepMode: true}, sc)
	for _, p := range []string{"/sleep", "/wake_up", "/is_sleeping"} {
		method := "POST"
		if p == "/is_sleeping" {
			method = "GET"
		}
		if st, body := status(method, off.url+p); st != 404 || body != `{"detail":"Not Found"}` {
			t.Fatalf("%s %s without dev mode: %d %s", method, p, st, body)
		}
	}

	noSleep := start(t, Config{DevMode: true}, sc)
	if st, body := status("POST", noSleep.url+"/sleep"); st != 500 || !strings.Contains(body, "Sleep mode is not enabled") {
		t.Fatalf("POST /sleep without sleep mode: %d %s", st, body)
	}
	if isSleeping(noSleep.url) {
		t.Fatal("asleep without sleep mode")
	}

	s := start(t, Config{DevMode: true, SleepMode: true}, sc)
	if st, body := status("GET", s.url+"/sleep"); st != 405 {
		t.Fatalf("GET /sleep: %d %s", st, body)
	}
	if st, body := status("POST", s.url+"/sleep?level=7"); st != 400 || !strings.Contains(body, "level") {
		t.Fatalf("POST /sleep?level=7: %d %s", st, body)
	}
	if isSleeping(s.url) {
		t.Fatal("asleep at start")
	}
	if st, body := status("POST", s.url+"/sleep?level=1"); st != 200 || body != "" {
		t.Fatalf("POST /sleep?level=1: %d %q", st, body)
	}
	if !isSleeping(s.url) {
		t.Fatal("awake after /sleep")
	}
	if st, _ := status("GET", s.url+"/health"); st != 200 {
		t.Fatalf("GET /health while asleep: %d; vLLM answers 200", st)
	}
	resp := do(t, "POST", s.url+"/v1/chat/completions", `{"model":"base","messages":[{"role":"user","content":"hi"}]}`)
	if b := readAll(t, resp); resp.StatusCode != 503 || !strings.Contains(string(b), "asleep") {
		t.Fatalf("a generation while asleep: %d %s", resp.StatusCode, b)
	}
	started := time.Now()
	if st, body := status("POST", s.url+"/wake_up?tags=weights&tags=kv_cache"); st != 200 || body != "" {
		t.Fatalf("POST /wake_up: %d %q", st, body)
	}
	if took := time.Since(started); took < sc.WakeTime {
		t.Fatalf("woke in %v, under the wake time %v", took, sc.WakeTime)
	}
	if isSleeping(s.url) {
		t.Fatal("asleep after /wake_up")
	}
	resp = do(t, "POST", s.url+"/v1/chat/completions", `{"model":"base","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("a generation after the wake-up: %d %s", resp.StatusCode, b)
	}
}
