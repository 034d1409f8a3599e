package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// syncBuffer is an output written from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// running is a tokenbus command running in the background, as a process
// would: JSON logs at debug into its own stderr.
type running struct {
	name           string
	stdout, stderr syncBuffer
	cancel         context.CancelFunc
	done           chan error
	stopOnce       sync.Once
}

func startCommand(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &running{name: args[0], cancel: cancel, done: make(chan error, 1)}
	args = append(args, "--log-format", "json", "--log-level", "debug")
	go func() { c.done <- Run(ctx, args, &c.stdout, &c.stderr) }()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop signals the command and waits for it to end.
func (c *running) stop(t *testing.T) {
	t.Helper()
	c.stopOnce.Do(func() {
		c.cancel()
		select {
		case err := <-c.done:
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s did not stop within 15s of the signal", c.name)
		}
	})
}

// waitLog waits for a log line with msg and returns it.
func (c *running) waitLog(t *testing.T, msg string) map[string]any {
	t.Helper()
	var line map[string]any
	testenv.WaitFor(t, 20*time.Second, func() error {
		recs, err := testenv.ParseJSONLog(c.stderr.Bytes())
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r["msg"] == msg {
				line = r
				return nil
			}
		}
		select {
		case err := <-c.done:
			t.Fatalf("%s ended before logging %q: %v\n%s", c.name, msg, err, c.stderr.Bytes())
		default:
		}
		return fmt.Errorf("%s has not logged %q yet", c.name, msg)
	})
	return line
}

// components checks every line of the command's log (one JSON object with
// unique keys, among them one component) and returns the components seen.
func (c *running) components(t *testing.T) []string {
	t.Helper()
	recs, err := testenv.ParseJSONLog(c.stderr.Bytes())
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	var seen []string
	for _, r := range recs {
		comp, ok := r["component"].(string)
		if !ok || comp == "" {
			t.Errorf("%s: a line without a component: %v", c.name, r)
			continue
		}
		if !slices.Contains(seen, comp) {
			seen = append(seen, comp)
		}
	}
	slices.Sort(seen)
	return seen
}

// post sends body to url and returns the status (the body read to its end).
func post(t *testing.T, url, body string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// requests exercises the paths that log: a stream, a non-stream request, an
// unknown model and one the engine refuses (a worker's debug line).
func requests(t *testing.T, api string) {
	t.Helper()
	for _, r := range []struct {
		path, body string
		status     int
	}{
		{"/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 200},
		{"/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`, 200},
		{"/v1/completions", `{"model":"no-such-model","prompt":"hi"}`, 404},
		{"/v1/completions", `{"model":"llama-8b","prompt":"x","max_tokens":100000}`, 400},
	} {
		if got := post(t, api+r.path, r.body); got != r.status {
			t.Fatalf("POST %s %s: %d, want %d", r.path, r.body, got, r.status)
		}
	}
}

// Every JSON log line of a run is one object with unique keys and one
// component: dev's and the gateway's dispatcher and admin lines used to carry
// the key twice ({"component":"dev","component":"gateway",...}), which
// Elasticsearch rejects.
func TestJSONLogsOneComponentPerLine(t *testing.T) {
	t.Run("dev", func(t *testing.T) {
		dev := startCommand(t, "dev", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--data-dir", "temp",
			"--sim-workers", "2", "--sim-decode-base", "1ms", "--sim-prefill-base", "1ms")
		var api string
		testenv.WaitFor(t, 20*time.Second, func() error {
			m := regexp.MustCompile(`OpenAI API\s+(http://\S+)/v1`).FindSubmatch(dev.stdout.Bytes())
			if m == nil {
				return fmt.Errorf("no banner yet")
			}
			api = string(m[1])
			return nil
		})
		requests(t, api)
		dev.stop(t)
		want := []string{"dispatcher", "gateway", "worker"} // dev's own lines are rare: warnings
		if got := dev.components(t); !isSubset(want, got) {
			t.Errorf("components %v, want at least %v", got, want)
		}
	})

	t.Run("distributed", func(t *testing.T) {
		ns := testenv.NATS(t)
		redis := testenv.StartRedis(t)
		natsURL, redisURL := ns.ClientURL(), "redis://127.0.0.1:"+strconv.Itoa(redis.Port)
		worker := startCommand(t, "worker", "--nats-url", natsURL, "--redis-url", redisURL, "--id", "logs-w1",
			"--metrics", "127.0.0.1:0", "--sim-decode-base", "1ms", "--sim-prefill-base", "1ms")
		worker.waitLog(t, "metrics listening")
		disp := startCommand(t, "dispatcher", "--nats-url", natsURL, "--redis-url", redisURL, "--metrics", "127.0.0.1:0")
		disp.waitLog(t, "metrics listening")
		gw := startCommand(t, "gateway", "--nats-url", natsURL, "--redis-url", redisURL, "--http", "127.0.0.1:0",
			"--admin", "127.0.0.1:0", "--admin-token", "adm-logs", "--auth=false")
		up := gw.waitLog(t, "gateway listening")
		api, _ := up["http"].(string)
		admin, _ := up["admin"].(string)
		testenv.WaitFor(t, 10*time.Second, func() error {
			resp, err := http.Get(api + "/ready")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("/ready: %d", resp.StatusCode)
			}
			return nil
		})
		requests(t, api)
		// The admin API logs its server-side failures: one, with Redis gone.
		redis.Stop()
		req, _ := http.NewRequest("GET", "http://"+admin+"/keys", nil)
		req.Header.Set("Authorization", "Bearer adm-logs")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("admin GET /keys with Redis down: %d, want 503", resp.StatusCode)
		}
		gw.waitLog(t, "admin request failed")

		for _, c := range []*running{gw, disp, worker} {
			c.stop(t)
		}
		for _, tc := range []struct {
			c    *running
			want []string
		}{
			{gw, []string{"admin", "dispatcher", "gateway"}},
			{disp, []string{"dispatcher"}},
			{worker, []string{"worker"}},
		} {
			if got := tc.c.components(t); !isSubset(tc.want, got) {
				t.Errorf("%s: components %v, want at least %v", tc.c.name, got, tc.want)
			}
		}
	})
}

func isSubset(want, got []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}
