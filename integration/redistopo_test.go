package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// failoverSetup is a Redis topology whose master a test kills: kill kills
// (SIGKILL) the master that holds the given Redis key's slot and returns
// its address; wait returns once a replica serves that slot as master.
type failoverSetup struct {
	topo registry.Topology
	kill func(t *testing.T, key string) string
	wait func(t *testing.T, key, old string)
}

// Sentinel: a master, two replicas, three sentinels (down after 500 ms).
// Two replicas, so that the promoted one still has a replica to confirm
// usage records (--redis-min-replicas auto: 1).
func TestSentinelFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	st := testenv.StartSentinel(t, testenv.RedisServer, 2)
	failoverUnderLoad(t, failoverSetup{
		topo: registry.Topology{Sentinel: st.URL},
		kill: func(t *testing.T, _ string) string { return st.KillMaster(t) },
		wait: func(t *testing.T, _, old string) { st.WaitFailover(t, old, 30*time.Second) },
	})
}

// Cluster: three masters with two replicas each (node timeout 1 s); the
// master of the loaded API key's slot is killed.
func TestClusterFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, testenv.RedisServer, 3, 9)
	failoverUnderLoad(t, failoverSetup{
		topo: registry.Topology{Cluster: cl.URL},
		kill: func(t *testing.T, key string) string { return cl.KillMasterOf(t, key) },
		wait: func(t *testing.T, key, old string) { cl.WaitFailover(t, key, old, 30*time.Second) },
	})
}

// failoverUnderLoad: 150 clients stream completions with an API key that
// has limits (so every request is a key lookup, a limit check and a usage
// record); the master that holds the key is killed with SIGKILL under that
// load and a replica is promoted. No request fails (keys from the cache,
// limits fail open while Redis cannot answer), every request's usage is in
// Redis exactly once afterwards (it waited in JetStream, and was confirmed
// by a replica before it was acknowledged there), and RPM and TPM limits
// hold on the promoted master.
func failoverUnderLoad(t *testing.T, f failoverSetup) {
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis, c.HTTP.Auth, c.HTTP.AdminToken = f.topo, true, limitsAdminToken
		c.HTTP.Limits.Breaker.Timeout = patientBreaker
		// Errors only: while Redis is down every request logs that its
		// limit check failed open.
		c.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	loadID, secret := newKey(t, d, `{"name":"load","tenant":"acme","rpm":1000000,"tpm":1000000000}`)
	// Keys for after the failover, made before it: they must survive it.
	_, rpmSecret := newKey(t, d, `{"name":"rpm","tenant":"acme","rpm":3}`)
	_, tpmSecret := newKey(t, d, `{"name":"tpm","tenant":"acme","tpm":200}`)
	auth := []string{"Authorization", "Bearer " + secret}
	warm := `{"model":"llama-8b","max_tokens":1,"prompt":"warm"}`
	if r := post(t, d.URL, "/v1/completions", warm, auth...); r.Status != 200 {
		t.Fatalf("warm-up: %d %s", r.Status, r.Body)
	}
	var base [3]int64
	testenv.WaitFor(t, 10*time.Second, func() error {
		if base[0], base[1], base[2] = usageOf(t, d, loadID); base[0] != 1 {
			return fmt.Errorf("warm-up usage: %d records", base[0])
		}
		return nil
	})

	const clients = 150
	var done, failed, prompt, completion atomic.Int64
	var afterFailover atomic.Int64 // requests begun after the promotion
	stop := make(chan struct{})
	promoted := make(chan struct{})
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				after := false
				select {
				case <-promoted:
					after = true
				default:
				}
				body := `{"model":"llama-8b","max_tokens":` + strconv.Itoa(2+(w+i)%7) +
					`,"prompt":"hello","stream":true,"stream_options":{"include_usage":true}}`
				r := post(t, d.URL, "/v1/completions", body, auth...)
				u, ok := usageIn(r)
				if r.Status != 200 || !ok {
					failed.Add(1)
					t.Errorf("client %d request %d: %d %s %v", w, i, r.Status, r.Body, tail(r.Events, 2))
					continue
				}
				prompt.Add(u.PromptTokens)
				completion.Add(u.CompletionTokens)
				done.Add(1)
				if after {
					afterFailover.Add(1)
				}
			}
		}()
	}
	// Under load (every client has had a request through), kill the
	// master of the load key's slot.
	testenv.WaitFor(t, 60*time.Second, func() error {
		if n := done.Load(); n < clients {
			return fmt.Errorf("%d requests done before the kill, want %d", n, clients)
		}
		return nil
	})
	slot := "tokenbus:key:{" + loadID + "}"
	beforeKill := done.Load()
	killed := time.Now()
	old := f.kill(t, slot)
	f.wait(t, slot, old)
	failover := time.Since(killed)
	duringFailover := done.Load() - beforeKill
	close(promoted)
	// The load goes on until as many requests again began and ended
	// against the promoted master.
	testenv.WaitFor(t, 120*time.Second, func() error {
		if n := afterFailover.Load(); n < clients {
			return fmt.Errorf("%d requests after the promotion, want %d", n, clients)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	total := done.Load()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), total+failed.Load())
	}

	var got [3]int64
	testenv.WaitFor(t, 60*time.Second, func() error {
		got[0], got[1], got[2] = usageOf(t, d, loadID)
		got[0], got[1], got[2] = got[0]-base[0], got[1]-base[1], got[2]-base[2]
		if got[0] != total {
			return fmt.Errorf("%d usage records in Redis, %d requests", got[0], total)
		}
		return nil
	})
	caughtUp := time.Since(killed)
	if got[1] != prompt.Load() || got[2] != completion.Load() {
		t.Fatalf("Redis has %d prompt + %d completion tokens; the clients were told %d + %d",
			got[1], got[2], prompt.Load(), completion.Load())
	}
	if v := metricValue(t, d.URL, "tokenbus_usage_dropped_total"); v != 0 {
		t.Fatalf("%v usage records dropped", v)
	}
	t.Logf("%s: %d streams at once: %d requests (%d while the master was down, %d after the promotion), 0 failed; "+
		"master %s killed, replica promoted after %s; usage of all %d requests in Redis once, %s after the kill (%d+%d tokens)",
		f.topo.Kind(), clients, total, duringFailover, afterFailover.Load(), old, failover.Round(time.Millisecond), got[0],
		caughtUp.Round(time.Millisecond), got[1], got[2])

	limitsHold(t, d, rpmSecret, tpmSecret)
}

// limitsHold checks, after a failover, that a key with RPM 3 gets 3
// requests and then 429, and one with TPM 200 is refused once its window
// holds 200 tokens, having served no more than one reservation over.
func limitsHold(t *testing.T, d *dev, rpmSecret, tpmSecret string) {
	t.Helper()
	// One window for both checks (Redis runs on this machine's clock; they
	// take a few seconds): at most a 10 s wait, most often none.
	testenv.WaitFor(t, 30*time.Second, func() error {
		if s := time.Now().Second(); s > 50 {
			return fmt.Errorf("%ds into the minute", s)
		}
		return nil
	})
	body := `{"model":"llama-8b","max_tokens":2,"prompt":"a"}`
	for i, want := range []int{200, 200, 200, 429} {
		if r := post(t, d.URL, "/v1/completions", body, "Authorization", "Bearer "+rpmSecret); r.Status != want {
			t.Fatalf("RPM 3 after the failover, request %d: %d, want %d: %s", i+1, r.Status, want, r.Body)
		}
	}
	c := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(tpmSecret), option.WithMaxRetries(0))
	var served int64
	refused := false
	for i := 0; i < 20 && !refused; i++ {
		var resp *http.Response
		comp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
			Model: "llama-8b", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(int64(30 + rand.IntN(20)))}, option.WithResponseInto(&resp))
		var apiErr *openai.Error
		switch {
		case err == nil:
			served += comp.Usage.TotalTokens
		case errors.As(err, &apiErr) && apiErr.StatusCode == 429:
			refused = true
		default:
			t.Fatalf("TPM request %d: %v", i+1, err)
		}
	}
	// Tokens are settled by the usage consumer, after the response: a
	// request admitted before the last one's settled still counts its
	// reservation (the prompt's estimate + at most 50), so at most one
	// reservation over.
	const tpm, reservation = 200, 120/4 + 50
	if !refused || served > tpm+reservation {
		t.Fatalf("TPM 200 after the failover: %d tokens served, refused: %v", served, refused)
	}
}

// The roles as processes of the built binary, named Redis by
// --redis-sentinel and by --redis-cluster: the worker registers its model,
// an API key made on the gateway's admin API serves a request, and its
// usage arrives.
func TestProcessesOnRedisTopologies(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes of the built binary")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	for _, tc := range []struct {
		flag  string
		start func(t *testing.T) string
	}{
		{"--redis-sentinel", func(t *testing.T) string { return testenv.StartSentinel(t, testenv.RedisServer, 2).URL }},
		{"--redis-cluster", func(t *testing.T) string { return testenv.StartCluster(t, testenv.RedisServer, 3, 6).URL }},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			t.Parallel()
			redisURL := tc.start(t)
			natsPort := testenv.FreePort(t)
			startProc(t, "nats-server", natsServer(t), "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", t.TempDir())
			common := []string{"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), tc.flag, redisURL, "--log-level", "warn"}
			startProc(t, "worker", bin, append([]string{"worker", "--id", "w1"}, common...)...)
			httpAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			adminAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			startProc(t, "gateway", bin, append([]string{"gateway", "--http", httpAddr, "--admin", adminAddr,
				"--admin-token", limitsAdminToken}, common...)...)
			base := "http://" + httpAddr
			waitReady(t, base)
			var key struct{ ID, Key string }
			admin := []string{"Authorization", "Bearer " + limitsAdminToken}
			if st, b, err := httpJSON("POST", "http://"+adminAddr+"/keys", "application/json",
				strings.NewReader(`{"name":"p","tenant":"acme","rpm":100}`), nil, admin...); err != nil || st != 201 || json.Unmarshal(b, &key) != nil {
				t.Fatalf("POST /keys: %d %s %v", st, b, err)
			}
			if r := post(t, base, "/v1/completions", `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`, "Authorization", "Bearer "+key.Key); r.Status != 200 {
				t.Fatalf("request: %d %s", r.Status, r.Body)
			}
			testenv.WaitFor(t, 20*time.Second, func() error {
				var u struct {
					Data []struct{ Requests int64 } `json:"data"`
				}
				st, b, err := httpJSON("GET", "http://"+adminAddr+"/usage?key_id="+key.ID, "", nil, &u, admin...)
				if err != nil || st != 200 || len(u.Data) != 1 || u.Data[0].Requests != 1 {
					return fmt.Errorf("usage: %d %s %v", st, b, err)
				}
				return nil
			})
		})
	}
}
