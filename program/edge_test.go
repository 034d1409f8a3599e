package program

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// edgeWorld is a gateway with auth and the admin API on real NATS and Redis,
// a sim worker, and an adapter registered on its model.
type edgeWorld struct {
	gw    *Gateway
	store *registry.Store
	http  *http.Client
}

const edgeAdminToken = "edge-admin-token-0123456789"

func startEdgeWorld(t testing.TB, trustedProxies string) *edgeWorld {
	t.Helper()
	ns := testenv.NATS(t)
	rd := testenv.StartRedis(t)
	ctx := context.Background()
	wc := DefaultWorker()
	wc.NATS.URL, wc.Redis.URL, wc.Worker.ID = ns.ClientURL(), rd.URL, "w1"
	fast(&wc.Engine)
	wk, err := StartWorker(ctx, wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })
	gc := DefaultGateway()
	gc.NATS.URL, gc.Redis.URL = ns.ClientURL(), rd.URL
	gc.HTTP.Listen, gc.HTTP.Admin, gc.HTTP.AdminToken, gc.HTTP.Auth = "127.0.0.1:0", "127.0.0.1:0", edgeAdminToken, true
	gc.HTTP.TrustedProxies = trustedProxies
	// A key lookup may take a second (the default bound is 50 ms): these
	// tests check what is refused and why, and on a busy test machine a
	// 50 ms lookup can time out into a 503.
	gc.HTTP.Limits.Breaker.Timeout = time.Second
	w := &edgeWorld{http: &http.Client{Timeout: 10 * time.Second}}
	if w.gw, err = StartGateway(ctx, gc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.gw.Close() })
	if w.store, err = registry.Open(ctx, rd.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.store.Close() })
	return w
}

// do sends a request; hdr is "Name: value" pairs.
func (w *edgeWorld) do(t *testing.T, method, url, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := w.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (w *edgeWorld) key(t testing.TB, models ...string) string {
	t.Helper()
	_, secret, err := w.store.CreateKey(context.Background(), registry.KeySpec{Tenant: "acme", Models: models})
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

func modelIDs(t *testing.T, body string) []string {
	t.Helper()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("not a model list: %s", body)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// With auth on, /v1/models (both forms) needs a key and lists only what the
// key may use; a model it may not use is 404, as if it did not exist.
func TestModelsNeedAKey(t *testing.T) {
	w := startEdgeWorld(t, "")
	base, admin := "http://"+w.gw.Addr(), "http://"+w.gw.AdminAddr()
	if st, _, body := w.do(t, "POST", admin+"/adapters", `{"name":"llama-8b-lora","base":"llama-8b","path":"sim://llama-8b-lora"}`,
		"Authorization: Bearer "+edgeAdminToken); st/100 != 2 {
		t.Fatalf("register adapter: %d %s", st, body)
	}
	all, onlyBase, onlyLora := w.key(t), w.key(t, "llama-8b"), w.key(t, "llama-8b-lora")
	testenv.WaitFor(t, 10*time.Second, func() error {
		_, _, body := w.do(t, "GET", base+"/v1/models", "", "Authorization: Bearer "+all)
		if !strings.Contains(body, "llama-8b-lora") {
			return fmt.Errorf("adapter not listed yet: %s", body)
		}
		return nil
	})

	for _, path := range []string{"/v1/models", "/v1/models/llama-8b", "/v1/models/nope",
		"/predictions/llama-8b/1.0/v1/models", "/predictions/llama-8b/1.0/v1/models/llama-8b"} {
		st, _, body := w.do(t, "GET", base+path, "")
		if st != http.StatusUnauthorized || !strings.Contains(body, `"invalid_api_key"`) {
			t.Errorf("GET %s without a key: %d %s", path, st, body)
		}
		st, _, body = w.do(t, "GET", base+path, "", "Authorization: Bearer tb-wrongwrongwrongwrongwrongwrong")
		if st != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong key: %d %s", path, st, body)
		}
	}
	for _, tc := range []struct {
		name, key string
		want      []string
	}{
		{"all models", all, []string{"llama-8b", "llama-8b-lora"}},
		{"base only", onlyBase, []string{"llama-8b"}},
		{"adapter only", onlyLora, []string{"llama-8b-lora"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, prefix := range []string{"/v1", "/predictions/llama-8b/1.0/v1"} {
				st, _, body := w.do(t, "GET", base+prefix+"/models", "", "Authorization: Bearer "+tc.key)
				if got := modelIDs(t, body); st != 200 || !slices.Equal(got, tc.want) {
					t.Errorf("%s/models: %d %v, want %v", prefix, st, got, tc.want)
				}
				for _, id := range []string{"llama-8b", "llama-8b-lora"} {
					st, _, body := w.do(t, "GET", base+prefix+"/models/"+id, "", "Authorization: Bearer "+tc.key)
					want := http.StatusNotFound
					if slices.Contains(tc.want, id) {
						want = http.StatusOK
					}
					if st != want || (want == 404 && !strings.Contains(body, `"model_not_found"`)) {
						t.Errorf("%s/models/%s: %d %s, want %d", prefix, id, st, body, want)
					}
				}
			}
		})
	}
}

// guess sends one wrong key and returns the status and Retry-After.
func (w *edgeWorld) guess(t *testing.T, i int, hdr ...string) (int, string) {
	t.Helper()
	st, h, body := w.do(t, "POST", "http://"+w.gw.Addr()+"/v1/completions", `{"model":"llama-8b","prompt":"hi","max_tokens":1}`,
		append(hdr, fmt.Sprintf("Authorization: Bearer tb-guess%04dguessguessguessguessguessguess", i))...)
	if st == http.StatusTooManyRequests && !strings.Contains(body, `"too_many_auth_failures"`) {
		t.Fatalf("429 that is not too_many_auth_failures: %s", body)
	}
	return st, h.Get("Retry-After")
}

// 300 wrong keys in a row from one address: the first 10 are checked
// (401), the rest get 429 with Retry-After without a lookup; a key in use
// before keeps working from that address; another address is not blocked;
// the admin token likewise.
func TestAuthFailuresThrottled(t *testing.T) {
	w := startEdgeWorld(t, "127.0.0.1/32") // the test's requests come through a "proxy" on 127.0.0.1
	base, admin := "http://"+w.gw.Addr(), "http://"+w.gw.AdminAddr()
	completion := `{"model":"llama-8b","prompt":"hi","max_tokens":1}`
	inUse, fresh := w.key(t), w.key(t)
	testenv.WaitFor(t, 10*time.Second, func() error {
		if st, _, body := w.do(t, "POST", base+"/v1/completions", completion, "Authorization: Bearer "+inUse); st != 200 {
			return fmt.Errorf("%d %s", st, body)
		}
		return nil
	})

	start := time.Now()
	counts := map[int]int{}
	first429 := -1
	for i := range 300 {
		st, ra := w.guess(t, i)
		counts[st]++
		if st == 429 {
			if first429 < 0 {
				first429 = i
			}
			if n, err := strconv.Atoi(ra); err != nil || n < 1 {
				t.Fatalf("429 with Retry-After %q", ra)
			}
		}
	}
	elapsed := time.Since(start)
	t.Logf("300 wrong keys from one address: %v in %v (%.0f requests/s); %d checked (401) before the first 429; checked guesses: %.1f/s",
		counts, elapsed.Round(time.Millisecond), 300/elapsed.Seconds(), first429, float64(counts[401])/elapsed.Seconds())
	if counts[401] != 10 || counts[429] != 290 || first429 != 10 {
		t.Fatalf("want 10×401 then 290×429, got %v (first 429 at %d)", counts, first429)
	}

	// From the blocked address: a key in use (cached) works; one the
	// gateway never saw is refused unchecked, like a guess.
	if st, _, body := w.do(t, "POST", base+"/v1/completions", completion, "Authorization: Bearer "+inUse); st != 200 {
		t.Fatalf("a key in use, from the blocked address: %d %s", st, body)
	}
	if st, _, body := w.do(t, "GET", base+"/v1/models", "", "Authorization: Bearer "+inUse); st != 200 {
		t.Fatalf("models with a key in use, from the blocked address: %d %s", st, body)
	}
	if st, _ := w.guess(t, 0, "Authorization: Bearer "+fresh); st != 429 {
		t.Fatalf("an uncached key from the blocked address: %d, want 429", st)
	}
	// A missing key is no guess: 401, not 429, and not counted.
	if st, _, _ := w.do(t, "GET", base+"/v1/models", ""); st != 401 {
		t.Fatalf("no key from the blocked address: %d, want 401", st)
	}
	// Another client behind the trusted proxy is not blocked, and its
	// uncached key works.
	if st, _, body := w.do(t, "POST", base+"/v1/completions", completion, "X-Forwarded-For: 198.51.100.7",
		"Authorization: Bearer "+fresh); st != 200 {
		t.Fatalf("another address: %d %s", st, body)
	}

	// Per key prefix: guesses sharing one prefix from many addresses.
	prefixCounts := map[int]int{}
	for i := range 15 {
		st, _, _ := w.do(t, "POST", base+"/v1/completions", completion, fmt.Sprintf("X-Forwarded-For: 203.0.113.%d", i+1),
			fmt.Sprintf("Authorization: Bearer tb-PFXsame%04dguessguessguessguessguessguess", i))
		prefixCounts[st]++
	}
	if prefixCounts[401] != 10 || prefixCounts[429] != 5 {
		t.Fatalf("one prefix from 15 addresses: %v, want 10×401 then 5×429", prefixCounts)
	}
	// Knowing a key's first characters must not lock its holder out: block
	// the prefix of a real key never used before, from other addresses; the
	// key still works (it is looked up), while guesses under that prefix get 429.
	victim := w.key(t)
	vp := victim[:len("tb-")+3]
	for i := range 12 {
		w.do(t, "POST", base+"/v1/completions", completion, fmt.Sprintf("X-Forwarded-For: 203.0.114.%d", i+1),
			"Authorization: Bearer "+vp+fmt.Sprintf("guess%04dguessguessguessguessguessguess", i))
	}
	if st, _, _ := w.do(t, "POST", base+"/v1/completions", completion, "X-Forwarded-For: 203.0.114.200",
		"Authorization: Bearer "+vp+"guessguessguessguessguessguessguessguess"); st != 429 {
		t.Fatalf("a guess under the blocked prefix: %d, want 429", st)
	}
	if st, _, body := w.do(t, "POST", base+"/v1/completions", completion, "X-Forwarded-For: 203.0.114.201",
		"Authorization: Bearer "+victim); st != 200 {
		t.Fatalf("the real key under a blocked prefix: %d %s, want 200", st, body)
	}

	// The admin token: 10 wrong ones, then 429 even for the right one (a
	// person's token may be weak: no oracle); other addresses unaffected.
	adminCounts := map[int]int{}
	for i := range 30 {
		st, _, _ := w.do(t, "GET", admin+"/keys", "", fmt.Sprintf("Authorization: Bearer wrong-admin-%d", i))
		adminCounts[st]++
	}
	if adminCounts[401] != 10 || adminCounts[429] != 20 {
		t.Fatalf("30 wrong admin tokens: %v, want 10×401 then 20×429", adminCounts)
	}
	if st, h, _ := w.do(t, "GET", admin+"/keys", "", "Authorization: Bearer "+edgeAdminToken); st != 429 || h.Get("Retry-After") == "" {
		t.Fatalf("right admin token from the blocked address: %d, want 429 with Retry-After", st)
	}
	if st, _, body := w.do(t, "GET", admin+"/keys", "", "X-Forwarded-For: 198.51.100.8", "Authorization: Bearer "+edgeAdminToken); st != 200 {
		t.Fatalf("right admin token from another address: %d %s", st, body)
	}

	_, _, metrics := w.do(t, "GET", base+"/metrics", "")
	for _, want := range []string{
		`tokenbus_auth_failures_total{api="openai",reason="unknown_key"} 38`,
		`tokenbus_auth_throttled_total{api="openai"} 299`,
		`tokenbus_auth_failures_total{api="admin",reason="wrong_admin_token"} 10`,
		`tokenbus_auth_throttled_total{api="admin"} 21`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
