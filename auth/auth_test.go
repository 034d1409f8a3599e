package auth_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/auth"
	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/gateway"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// usageOf is what the fake worker reports per model.
var usageOf = map[string]schemas.Usage{
	"llama-8b": {PromptTokens: 9, CompletionTokens: 2, TotalTokens: 11},
	"other":    {PromptTokens: 5, CompletionTokens: 7, TotalTokens: 12},
}

// fakeWorker answers every request on the bus like a worker would: accepted,
// then for a stream a chunk and the usage chunk, then done.
func fakeWorker(t *testing.T, ns *server.Server) {
	wc := testenv.Connect(t, ns)
	_, err := wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) {
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		_ = json.Unmarshal(m.Data, &req)
		u := usageOf[req.Model]
		ub, _ := json.Marshal(u)
		pub := func(typ schemas.FrameType, seq uint64, payload string) {
			_ = wc.Publish(m.Reply, schemas.AppendFrame(nil, typ, seq, []byte(payload)))
		}
		acc, _ := json.Marshal(schemas.Accepted{RequestID: m.Header.Get(schemas.HdrRequestID), Worker: "w1",
			Cancel: schemas.CancelSubject("w1")})
		pub(schemas.FrameAccepted, 1, string(acc))
		if !req.Stream {
			pub(schemas.FrameDone, 2, fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":"stop"}],"usage":%s}`, req.Model, ub))
			return
		}
		pub(schemas.FrameChunk, 2, fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":"stop"}]}`, req.Model))
		pub(schemas.FrameChunk, 3, fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[],"usage":%s}`, req.Model, ub))
		pub(schemas.FrameDone, 4, fmt.Sprintf(`{"usage":%s}`, ub))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := wc.Flush(); err != nil {
		t.Fatal(err)
	}
}

type catalog struct{}

func (catalog) Known(m string) bool { _, ok := usageOf[m]; return ok }
func (catalog) Models() []schemas.Model {
	return nil
}
func (catalog) WorkersUp() int      { return 1 }
func (catalog) WorkersServing() int { return 1 }

// replica is one gateway with its own NATS connection, Redis client, key
// cache and limiter, as separate gateway processes have.
type replica struct {
	url   string
	auth  *auth.Auth
	store *registry.Store
	reg   *prometheus.Registry
}

// clock pins the limiters of every replica to one time, so that no test
// straddles a minute boundary.
var clock = func() time.Time { return time.Unix(1_800_000_000/60*60+5, 0) }

func startReplica(t *testing.T, ns *server.Server, redisURL string, withKeys bool) *replica {
	t.Helper()
	store, err := registry.Open(context.Background(), redisURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	nc := testenv.Connect(t, ns)
	lim := registry.NewLimiter(store)
	lim.Now = clock
	cfg := auth.Config{Limiter: lim, Timeout: time.Second}
	if withKeys {
		// An hour's TTL: only the key event can make a deletion visible quickly.
		cfg.Keys = registry.NewKeyCache(store, time.Hour, nil)
		stop, err := cfg.Keys.Subscribe(nc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	r := &replica{store: store, reg: prometheus.NewRegistry()}
	cfg.Metrics = r.reg
	r.auth = auth.New(cfg)
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := gateway.New(gateway.Config{Authorize: r.auth.Authorize, OnUsage: r.auth.OnUsage}, cl, catalog{}, nc, nil, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
		_ = cl.Close()
	})
	r.url = "http://" + ln.Addr().String()
	return r
}

// world is a NATS server with a fake worker, a Redis, and gateway replicas.
type world struct {
	redis *testenv.Redis
	nc    *nats.Conn // for the admin's events
	store *registry.Store
	gws   []*replica
}

func newWorld(t *testing.T, replicas int) *world {
	ns := testenv.NATS(t)
	fakeWorker(t, ns)
	w := &world{redis: testenv.StartRedis(t), nc: testenv.Connect(t, ns)}
	for range replicas {
		w.gws = append(w.gws, startReplica(t, ns, w.redis.URL, true))
	}
	w.store = w.gws[0].store
	return w
}

func (w *world) key(t *testing.T, spec registry.KeySpec) (registry.Key, string) {
	t.Helper()
	k, secret, err := w.store.CreateKey(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return k, secret
}

// waitUsage waits for every replica's usage writes to land.
func (w *world) waitUsage(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, g := range w.gws {
		if err := g.auth.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// response is an HTTP answer with what the client got of usage.
type response struct {
	status int
	header http.Header
	body   string
	usage  schemas.Usage
}

func (r response) errCode() string {
	var e struct {
		Error struct {
			Code *string `json:"code"`
			Type string  `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(r.body), &e) != nil || e.Error.Code == nil || e.Error.Type == "" {
		return "<not an OpenAI error: " + r.body + ">"
	}
	return *e.Error.Code
}

// complete sends a completion request with key (none if empty) to base.
func complete(t *testing.T, base, key, model string, stream bool) response {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":"hi","stream":%v}`, model, stream)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := response{status: resp.StatusCode, header: resp.Header}
	if !stream || resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		r.body = string(b)
		var u struct {
			Usage schemas.Usage `json:"usage"`
		}
		_ = json.Unmarshal(b, &u)
		r.usage = u.Usage
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		r.body += line + "\n"
		var u struct {
			Usage *schemas.Usage `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &u) == nil && u.Usage != nil {
			r.usage = *u.Usage
		}
	}
	return r
}

func TestAuthorizeErrors(t *testing.T) {
	w := newWorld(t, 1)
	gw := w.gws[0]
	_, secret := w.key(t, registry.KeySpec{Tenant: "acme", Models: []string{"llama-8b"}})
	_, open := w.key(t, registry.KeySpec{Tenant: "acme"})
	for _, tc := range []struct {
		name, header, model string
		status              int
		code                string
	}{
		{"no key", "", "llama-8b", 401, schemas.ErrInvalidKey.Code},
		{"not bearer", "Basic " + secret, "llama-8b", 401, schemas.ErrInvalidKey.Code},
		{"not a key", "Bearer sk-123", "llama-8b", 401, schemas.ErrInvalidKey.Code},
		{"unknown key", "Bearer tb-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "llama-8b", 401, schemas.ErrInvalidKey.Code},
		{"model not allowed", "Bearer " + secret, "other", 403, schemas.ErrModelNotAllowed.Code},
		{"allowed", "Bearer " + secret, "llama-8b", 200, ""},
		{"lower-case scheme", "bearer " + secret, "llama-8b", 200, ""},
		{"key for all models", "Bearer " + open, "other", 200, ""},
	} {
		for _, stream := range []bool{false, true} {
			req, _ := http.NewRequest(http.MethodPost, gw.url+"/v1/completions",
				strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hi","stream":%v}`, tc.model, stream)))
			req.Header.Set("Content-Type", "application/json")
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			r := response{status: resp.StatusCode, body: string(b)}
			if r.status != tc.status || tc.code != "" && r.errCode() != tc.code {
				t.Fatalf("%s (stream %v): %d %s", tc.name, stream, r.status, r.body)
			}
			if strings.Contains(r.body, secret) || resp.Header.Get("x-ratelimit-limit-requests") != "" {
				t.Fatalf("%s: leaked the secret or sent limit headers for an unlimited key: %v %s", tc.name, resp.Header, r.body)
			}
		}
	}
	for outcome, want := range map[string]float64{"ok": 6, "missing_key": 4, "invalid_key": 4, "model_not_allowed": 2, "rate_limited": 0} {
		if n := decisions(gw, outcome); n != want {
			t.Errorf("decisions{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
}

// decisions reads tokenbus_auth_decisions_total{outcome}.
func decisions(r *replica, outcome string) float64 {
	fams, _ := r.reg.Gather()
	for _, f := range fams {
		if f.GetName() != "tokenbus_auth_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// RPM is shared by two gateway replicas: the 5th request of a key with RPM 4
// is refused whichever replica gets it, with OpenAI's headers.
func TestRequestsPerMinuteAcrossGateways(t *testing.T) {
	w := newWorld(t, 2)
	_, secret := w.key(t, registry.KeySpec{Tenant: "acme", RPM: 4})
	for i := range 4 {
		r := complete(t, w.gws[i%2].url, secret, "llama-8b", i%2 == 0)
		if r.status != 200 || r.header.Get("x-ratelimit-limit-requests") != "4" ||
			r.header.Get("x-ratelimit-remaining-requests") != strconv.Itoa(3-i) ||
			r.header.Get("x-ratelimit-reset-requests") != "55s" || r.header.Get("x-ratelimit-limit-tokens") != "" {
			t.Fatalf("request %d: %d %v %s", i+1, r.status, r.header, r.body)
		}
	}
	for i, stream := range []bool{false, true} {
		r := complete(t, w.gws[i].url, secret, "llama-8b", stream)
		if r.status != 429 || r.errCode() != schemas.ErrRateLimited.Code || r.header.Get("Retry-After") != "55" ||
			r.header.Get("x-ratelimit-remaining-requests") != "0" || r.header.Get("x-ratelimit-limit-requests") != "4" {
			t.Fatalf("over the limit on replica %d: %d %v %s", i, r.status, r.header, r.body)
		}
	}
	// Another key is not affected.
	_, other := w.key(t, registry.KeySpec{Tenant: "acme", RPM: 4})
	if r := complete(t, w.gws[1].url, other, "llama-8b", false); r.status != 200 {
		t.Fatalf("other key: %d %s", r.status, r.body)
	}
}

// TPM counts the usage of finished requests, on every replica: with TPM 20
// and 11 tokens a request, the third request is refused.
func TestTokensPerMinuteAcrossGateways(t *testing.T) {
	w := newWorld(t, 2)
	_, secret := w.key(t, registry.KeySpec{Tenant: "acme", TPM: 20})
	for i, wantRemaining := range []string{"20", "9"} {
		r := complete(t, w.gws[i].url, secret, "llama-8b", i == 1)
		if r.status != 200 || r.usage.TotalTokens != 11 || r.header.Get("x-ratelimit-limit-tokens") != "20" ||
			r.header.Get("x-ratelimit-remaining-tokens") != wantRemaining || r.header.Get("x-ratelimit-reset-tokens") != "55s" {
			t.Fatalf("request %d: %d %v %s", i+1, r.status, r.header, r.body)
		}
		w.waitUsage(t)
	}
	r := complete(t, w.gws[0].url, secret, "llama-8b", false)
	if r.status != 429 || r.errCode() != schemas.ErrRateLimited.Code || r.header.Get("Retry-After") != "55" ||
		r.header.Get("x-ratelimit-remaining-tokens") != "0" || !strings.Contains(r.body, "TPM") {
		t.Fatalf("over TPM: %d %v %s", r.status, r.header, r.body)
	}
}

// Usage per key and model is what the clients were told, summed over both
// replicas, streams and plain responses.
func TestUsageMatchesResponses(t *testing.T) {
	w := newWorld(t, 2)
	ka, a := w.key(t, registry.KeySpec{Tenant: "acme"})
	kb, b := w.key(t, registry.KeySpec{Tenant: "beta", RPM: 100, TPM: 100000})
	type sum struct{ req, p, c int64 }
	want := map[string]*sum{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, secret := ka, a
			if i%3 == 0 {
				k, secret = kb, b
			}
			model := "llama-8b"
			if i%4 == 0 {
				model = "other"
			}
			r := complete(t, w.gws[i%2].url, secret, model, i%2 == 0)
			if r.status != 200 || r.usage.TotalTokens == 0 {
				t.Errorf("request %d: %d %s", i, r.status, r.body)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			s := want[k.ID+" "+model]
			if s == nil {
				s = &sum{}
				want[k.ID+" "+model] = s
			}
			s.req++
			s.p += int64(r.usage.PromptTokens)
			s.c += int64(r.usage.CompletionTokens)
		}()
	}
	wg.Wait()
	w.waitUsage(t)
	rows, err := w.store.Usage(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(want) {
		t.Fatalf("usage rows %+v, want %d", rows, len(want))
	}
	for _, r := range rows {
		s := want[r.KeyID+" "+r.Model]
		if s == nil || r.Requests != s.req || r.PromptTokens != s.p || r.CompletionTokens != s.c {
			t.Fatalf("usage %+v, clients got %+v", r, s)
		}
	}
}

// A deleted key stops working on every replica as soon as the event is
// out, though the caches hold keys for an hour.
func TestDeletedKeyStopsAtOnce(t *testing.T) {
	w := newWorld(t, 2)
	k, secret := w.key(t, registry.KeySpec{Tenant: "acme"})
	for _, g := range w.gws {
		if r := complete(t, g.url, secret, "llama-8b", false); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	if err := w.store.DeleteKey(context.Background(), k.ID); err != nil {
		t.Fatal(err)
	}
	if err := registry.AnnounceKeys(w.nc, k.ID); err != nil {
		t.Fatal(err)
	}
	for _, g := range w.gws {
		testenv.WaitFor(t, 2*time.Second, func() error {
			if r := complete(t, g.url, secret, "llama-8b", false); r.status != 401 {
				return fmt.Errorf("deleted key: %d", r.status)
			}
			return nil
		})
	}
}

// With Redis down a known key keeps working (limits fail open), an unknown
// one gets 503, and usage that cannot be written is counted as lost.
func TestRedisDown(t *testing.T) {
	w := newWorld(t, 1)
	gw := w.gws[0]
	_, secret := w.key(t, registry.KeySpec{Tenant: "acme", RPM: 1})
	if r := complete(t, gw.url, secret, "llama-8b", false); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	w.waitUsage(t)
	w.redis.Stop()
	for range 3 { // over its RPM of 1: the limit cannot be checked
		if r := complete(t, gw.url, secret, "llama-8b", true); r.status != 200 || r.usage.TotalTokens != 11 {
			t.Fatalf("known key, Redis down: %d %s", r.status, r.body)
		}
	}
	r := complete(t, gw.url, "tb-unknownunknownunknownunknownunknownunknownu", "llama-8b", false)
	if r.status != 503 || r.errCode() != schemas.ErrStoreUnavailable.Code || r.header.Get("Retry-After") == "" {
		t.Fatalf("unknown key, Redis down: %d %v %s", r.status, r.header, r.body)
	}
	w.waitUsage(t)
	if n := decisions(gw, "fail_open"); n != 3 {
		t.Fatalf("fail_open decisions = %v", n)
	}
	fams, _ := gw.reg.Gather()
	got := map[string]float64{}
	for _, f := range fams {
		if len(f.GetMetric()) == 1 && f.GetMetric()[0].Counter != nil {
			got[f.GetName()] = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got["tokenbus_auth_ratelimit_fail_open_total"] != 3 || got["tokenbus_auth_usage_lost_total"] != 3 {
		t.Fatalf("metrics %v", got)
	}
}

// With authentication off every request passes and usage is counted as
// anonymous.
func TestAuthOff(t *testing.T) {
	ns := testenv.NATS(t)
	fakeWorker(t, ns)
	rd := testenv.StartRedis(t)
	gw := startReplica(t, ns, rd.URL, false)
	if r := complete(t, gw.url, "", "llama-8b", false); r.status != 200 || r.header.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gw.auth.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := gw.store.Usage(ctx, registry.AnonymousKey, "")
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 || rows[0].TotalTokens != 11 {
		t.Fatalf("%+v %v", rows, err)
	}
}

// Admit is the limit check without Fiber (for NATS-native requests): it
// reserves, refuses with 429 and Retry-After, and when Redis cannot answer
// allows (fail open) or refuses with 503 (FailClosed), as configured.
func TestAdmit(t *testing.T) {
	rd := testenv.StartRedis(t)
	store, err := registry.Open(context.Background(), rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	store.UseBreaker(registry.NewBreaker(registry.BreakerConfig{}))
	lim := registry.NewLimiter(store)
	lim.Now = clock
	open, closed := auth.New(auth.Config{Limiter: lim}), auth.New(auth.Config{Limiter: lim, FailClosed: true})
	k := registry.Key{ID: "key_admit", KeySpec: registry.KeySpec{RPM: 2, TPM: 1000}}
	ctx := context.Background()
	req, perr := schemas.ReadRequest(schemas.KindCompletion, []byte(`{"model":"m","prompt":["a","b"],"max_tokens":10}`), "")
	if perr != nil {
		t.Fatal(perr)
	}
	adm := open.AdmissionOf(req)
	if adm.Requests != 2 || adm.Tokens != 12+20 {
		t.Fatalf("admission %+v", adm)
	}
	d, e := open.Admit(ctx, k, adm)
	if e != nil || !d.Allowed || d.Reserved != adm.Tokens || d.Window == 0 {
		t.Fatalf("first: %+v %v", d, e)
	}
	d, e = open.Admit(ctx, k, registry.Admission{Requests: 1})
	if e == nil || e.Status != 429 || e.RetryAfter == 0 || d.Allowed {
		t.Fatalf("over RPM: %+v %v", d, e)
	}
	rd.Stop()
	for _, tc := range []struct {
		a       *auth.Auth
		allowed bool
	}{{open, true}, {closed, false}} {
		d, e := tc.a.Admit(ctx, registry.Key{ID: "key_other", KeySpec: registry.KeySpec{RPM: 1}}, registry.Admission{Requests: 1, Tokens: 5})
		switch {
		case tc.allowed && (e != nil || !d.Allowed || d.Reserved != 0):
			t.Fatalf("fail open: %+v %v", d, e)
		case !tc.allowed && (e == nil || e.Status != 503 || e.Body.Code == nil || *e.Body.Code != schemas.ErrStoreUnavailable.Code):
			t.Fatalf("fail closed: %+v %v", d, e)
		}
	}
}
