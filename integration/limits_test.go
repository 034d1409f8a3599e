package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
)

const limitsAdminToken = "limits-admin-token"

// limitsDev is tokenbus dev with API keys, on a real redis-server started
// with args.
func limitsDev(t *testing.T, args ...string) (*dev, *testenv.Redis) {
	t.Helper()
	return limitsDevBounded(t, patientBreaker, args...)
}

// patientBreaker bounds each Redis call on a request's path at a second
// (the gateway's default is 50 ms) where a test checks limits and usage,
// not that bound: on a busy test machine a 50 ms call can time out, and the
// check fail open or the key lookup fail with 503. TestRedisStoppedBoundedWait
// checks the bound, with the default.
const patientBreaker = time.Second

// limitsDevBounded is limitsDev with each Redis call bounded by timeout.
func limitsDevBounded(t *testing.T, timeout time.Duration, args ...string) (*dev, *testenv.Redis) {
	t.Helper()
	rd := testenv.StartRedis(t, args...)
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL, c.HTTP.Auth, c.HTTP.AdminToken = rd.URL, true, limitsAdminToken
		c.HTTP.Limits.Breaker.Timeout = timeout
	})
	return d, rd
}

// newKey creates an API key on the admin API and returns its id and secret.
func newKey(t *testing.T, d *dev, spec string) (id, secret string) {
	t.Helper()
	var key struct{ ID, Key string }
	if st := adminCall(t, d, limitsAdminToken, "POST", "/keys", spec, &key); st != 201 {
		t.Fatalf("POST /keys %s: %d", spec, st)
	}
	return key.ID, key.Key
}

// awayFromMinuteEnd waits until Redis's clock is at most 40 s into its
// minute, so that a test's requests share one rate-limit window.
func awayFromMinuteEnd(t *testing.T, rd *testenv.Redis) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr})
	defer rdb.Close()
	testenv.WaitFor(t, 30*time.Second, func() error {
		now, err := rdb.Time(context.Background()).Result()
		if err != nil {
			return err
		}
		if s := now.Second(); s > 40 {
			return fmt.Errorf("%ds into the minute", s)
		}
		return nil
	})
}

// A key with TPM 200 and 20 concurrent requests of max_tokens 50, through
// the official client: the tokens served exceed 200 by at most one
// request's reservation (its prompt estimate + 50), and the others get 429
// with Retry-After. Before reservations all 20 were served (about 1,000
// tokens).
func TestTPMHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	d, rd := limitsDev(t)
	_, secret := newKey(t, d, `{"name":"tpm","tenant":"acme","tpm":200}`)
	awayFromMinuteEnd(t, rd)
	c := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(secret), option.WithMaxRetries(0))
	var served, ok, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var resp *http.Response
			comp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
				Model: "llama-8b", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
				MaxTokens: openai.Int(50)}, option.WithResponseInto(&resp))
			var apiErr *openai.Error
			switch {
			case err == nil:
				ok.Add(1)
				served.Add(comp.Usage.TotalTokens)
			case errors.As(err, &apiErr) && apiErr.StatusCode == 429 && apiErr.Code == "rate_limit_exceeded" &&
				resp != nil && resp.Header.Get("Retry-After") != "":
				refused.Add(1)
			default:
				t.Errorf("request: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	// One reservation: the body (under 120 bytes) / 4 for the prompt + 50.
	const tpm, reservation = 200, 120/4 + 50
	t.Logf("served %d tokens in %d requests, %d refused (TPM %d)", served.Load(), ok.Load(), refused.Load(), tpm)
	if served.Load() > tpm+reservation || refused.Load() == 0 || ok.Load()+refused.Load() != 20 {
		t.Fatalf("served %d tokens in %d requests (%d refused) under TPM %d: more than one reservation (%d) over",
			served.Load(), ok.Load(), refused.Load(), tpm, reservation)
	}
}

// A prompt array of n prompts counts n requests against RPM.
func TestPromptArrayCountsRequests(t *testing.T) {
	t.Parallel()
	d, rd := limitsDev(t)
	_, secret := newKey(t, d, `{"name":"rpm","tenant":"acme","rpm":3}`)
	awayFromMinuteEnd(t, rd)
	for i, tc := range []struct {
		prompt string
		status int
	}{{`["a","b","c","d"]`, 429}, {`["a","b"]`, 200}, {`["a","b"]`, 429}, {`"a"`, 200}, {`"a"`, 429}} {
		r := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":2,"prompt":`+tc.prompt+`}`,
			"Authorization", "Bearer "+secret)
		if r.Status != tc.status {
			t.Fatalf("request %d (prompt %s): %d, want %d: %s", i, tc.prompt, r.Status, tc.status, r.Body)
		}
	}
}

// usageOf reads a key's usage on the admin API.
func usageOf(t *testing.T, d *dev, keyID string) (requests, prompt, completion int64) {
	var u struct {
		Data []struct {
			Requests         int64 `json:"requests"`
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"data"`
	}
	if st := adminCall(t, d, limitsAdminToken, "GET", "/usage?key_id="+keyID, "", &u); st != 200 {
		return -1, 0, 0
	}
	for _, r := range u.Data {
		requests += r.Requests
		prompt += r.PromptTokens
		completion += r.CompletionTokens
	}
	return
}

// With redis-server stopped (SIGSTOP: connections hang, nothing is
// refused) a request with a cached key waits at most the breaker's bounded
// wait for the limit check, not 2 s; an unknown key gets 503; after SIGCONT
// limits are checked again and the usage of every request arrives.
// Not parallel: bounds of 500 ms, which neighbours would eat into.
func TestRedisStoppedBoundedWait(t *testing.T) {
	d, rd := limitsDevBounded(t, program.DefaultLimits().Breaker.Timeout)
	keyID, secret := newKey(t, d, `{"name":"stop","tenant":"acme","rpm":10000}`)
	body := `{"model":"llama-8b","max_tokens":3,"prompt":"hi"}`
	auth := []string{"Authorization", "Bearer " + secret}
	if r := post(t, d.URL, "/v1/completions", body, auth...); r.Status != 200 || r.Header.Get("x-ratelimit-limit-requests") != "10000" {
		t.Fatalf("before: %d %v %s", r.Status, r.Header, r.Body)
	}
	pid := rd.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	defer cont()
	var slowest time.Duration
	const n = 20
	for i := range n {
		r := post(t, d.URL, "/v1/completions", body, auth...)
		if r.Status != 200 {
			t.Fatalf("request %d with Redis stopped: %d %s", i, r.Status, r.Body)
		}
		slowest = max(slowest, r.Elapsed)
	}
	t.Logf("Redis stopped: slowest of %d requests %s", n, slowest)
	// The bounded wait is 50ms; the rest is the request itself on a busy
	// machine. Without the breaker each took 2.05s.
	if slowest > 500*time.Millisecond {
		t.Fatalf("a request took %s with Redis stopped", slowest)
	}
	start := time.Now()
	r := post(t, d.URL, "/v1/completions", body, "Authorization", "Bearer tb-unknownunknownunknownunknownunknownunknown1")
	if r.Status != 503 || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("unknown key with Redis stopped: %d after %s: %s", r.Status, time.Since(start), r.Body)
	}
	if v := metricValue(t, d.URL, "tokenbus_redis_breaker_state"); v != 2 {
		t.Fatalf("breaker state %v, want 2 (open)", v)
	}

	cont()
	testenv.WaitFor(t, 10*time.Second, func() error {
		r := post(t, d.URL, "/v1/completions", body, auth...)
		if r.Status != 200 || r.Header.Get("x-ratelimit-limit-requests") != "10000" {
			return fmt.Errorf("after SIGCONT: %d, limit header %q", r.Status, r.Header.Get("x-ratelimit-limit-requests"))
		}
		return nil
	})
	// Every request's usage arrives: the one before, the n during, and
	// those after (at least one).
	testenv.WaitFor(t, 20*time.Second, func() error {
		if req, _, _ := usageOf(t, d, keyID); req < n+2 {
			return fmt.Errorf("usage of %d requests recorded, want at least %d", req, n+2)
		}
		return nil
	})
	if v := metricValue(t, d.URL, "tokenbus_redis_breaker_state"); v != 0 {
		t.Fatalf("breaker state %v after recovery, want 0 (closed)", v)
	}
}

// redis-server killed (SIGKILL) under load and restarted on the same port:
// no request fails, and every request's usage arrives in Redis exactly
// once — as many records as requests, the tokens the clients were told.
func TestUsageExactlyOnceThroughRedisKill(t *testing.T) {
	t.Parallel()
	d, rd := limitsDev(t, testenv.DurableRedis...)
	keyID, secret := newKey(t, d, `{"name":"kill","tenant":"acme","rpm":100000,"tpm":100000000}`)
	auth := []string{"Authorization", "Bearer " + secret}
	// One request first: the key cached and Redis's connections dialled, so
	// the load measures the outage, not a cold start on a busy machine.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if r := post(t, d.URL, "/v1/completions", `{"model":"llama-8b","max_tokens":1,"prompt":"warm"}`, auth...); r.Status != 200 {
			return fmt.Errorf("warm-up: %d %s", r.Status, r.Body)
		}
		return nil
	})
	var base [3]int64 // the warm-up's usage, once it is in Redis
	testenv.WaitFor(t, 10*time.Second, func() error {
		if base[0], base[1], base[2] = usageOf(t, d, keyID); base[0] != 1 {
			return fmt.Errorf("warm-up usage: %d records", base[0])
		}
		return nil
	})
	const total = 240
	var next, done, failed atomic.Int64
	var prompt, completion atomic.Int64
	killed, restarted := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > total {
					return
				}
				stream := (i+int64(w))%2 == 0
				body := `{"model":"llama-8b","max_tokens":` + strconv.Itoa(int(2+i%5)) + `,"prompt":"hello","stream":` +
					strconv.FormatBool(stream) + `,"stream_options":{"include_usage":true}}`
				if !stream {
					body = `{"model":"llama-8b","max_tokens":` + strconv.Itoa(int(2+i%5)) + `,"prompt":"hello"}`
				}
				r := post(t, d.URL, "/v1/completions", body, auth...)
				u, ok := usageIn(r)
				if r.Status != 200 || !ok {
					failed.Add(1)
					t.Errorf("request %d: %d %s %v", i, r.Status, r.Body, r.Events)
					continue
				}
				prompt.Add(u.PromptTokens)
				completion.Add(u.CompletionTokens)
				switch done.Add(1) {
				case 60:
					close(killed)
				case 150:
					close(restarted)
				}
			}
		}()
	}
	<-killed
	rd.Stop() // SIGKILL
	<-restarted
	rd.Restart(t)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), total)
	}
	var got [3]int64
	testenv.WaitFor(t, 30*time.Second, func() error {
		got[0], got[1], got[2] = usageOf(t, d, keyID)
		got[0], got[1], got[2] = got[0]-base[0], got[1]-base[1], got[2]-base[2]
		if got[0] != total {
			return fmt.Errorf("%d usage records in Redis, %d requests", got[0], total)
		}
		return nil
	})
	if got[1] != prompt.Load() || got[2] != completion.Load() {
		t.Fatalf("Redis has %d prompt + %d completion tokens; the clients were told %d + %d", got[1], got[2], prompt.Load(), completion.Load())
	}
	if v := metricValue(t, d.URL, "tokenbus_usage_dropped_total"); v != 0 {
		t.Fatalf("%v usage records dropped", v)
	}
	t.Logf("%d requests, Redis killed after 60 and restarted after 150: %d records, %d+%d tokens in Redis",
		total, got[0], got[1], got[2])
}

// usageIn is the usage a response told its client.
func usageIn(r sse) (u struct{ PromptTokens, CompletionTokens int64 }, ok bool) {
	var v struct {
		Usage *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	parse := func(s string) {
		if json.Unmarshal([]byte(s), &v) == nil && v.Usage != nil {
			u.PromptTokens, u.CompletionTokens, ok = v.Usage.PromptTokens, v.Usage.CompletionTokens, true
		}
	}
	if r.Body != "" {
		parse(r.Body)
	}
	for _, e := range r.Events {
		parse(e)
	}
	return u, ok
}
