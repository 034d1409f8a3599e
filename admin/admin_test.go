package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/admin"
	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

const token = "admin-secret-token"

// world is a redis-server, a NATS server, fake workers and the admin API on
// a real listener.
type world struct {
	t     *testing.T
	redis *testenv.Redis
	ns    *server.Server
	nc    *nats.Conn
	store *registry.Store
	fleet *fleet.Fleet
	url   string
	srv   *admin.Server
}

func newWorld(t *testing.T, configure ...func(*admin.Config)) *world {
	t.Helper()
	w := &world{t: t, redis: testenv.StartRedis(t), ns: testenv.NATS(t), fleet: fleet.New()}
	w.nc = testenv.Connect(t, w.ns)
	var err error
	if w.store, err = registry.Open(context.Background(), w.redis.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := fleet.Watch(ctx, w.nc, w.fleet); err != nil {
		t.Fatal(err)
	}
	cfg := admin.Config{Token: token, Store: w.store, NC: w.nc, Fleet: w.fleet, CtlTimeout: time.Second}
	for _, c := range configure {
		c(&cfg)
	}
	srv, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.srv = srv
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	w.url = "http://" + ln.Addr().String()
	return w
}

// fakeWorker heartbeats with the given models and answers control requests
// (unless mute); fail makes it refuse them. It records what it was asked.
type fakeWorker struct {
	id  string
	nc  *nats.Conn
	mu  sync.Mutex
	ops []string // "op name"
}

func (w *world) worker(id string, models, adapters []string, mute, fail bool) *fakeWorker {
	t := w.t
	f := &fakeWorker{id: id, nc: testenv.Connect(t, w.ns)}
	if !mute {
		_, err := f.nc.Subscribe(schemas.CtlSubject(id, "*"), func(m *nats.Msg) {
			op := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			var req schemas.AdapterRequest
			_ = json.Unmarshal(m.Data, &req)
			f.mu.Lock()
			f.ops = append(f.ops, strings.TrimSpace(op+" "+req.Name))
			f.mu.Unlock()
			r := schemas.CtlReply{OK: !fail}
			if fail {
				r.Error = schemas.ErrInternal.New("engine said no")
			}
			b, _ := json.Marshal(r)
			_ = m.Respond(b)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	f.beat(t, models, adapters)
	sent := time.Now()
	testenv.WaitFor(t, 5*time.Second, func() error {
		// A beat published before the fleet's subscription reached the
		// server is lost: send it again now and then, as a worker would.
		if time.Since(sent) > 200*time.Millisecond {
			f.beat(t, models, adapters)
			sent = time.Now()
		}
		for _, x := range w.fleet.Workers() {
			if x.Worker == id && len(x.Models) == len(models) {
				return nil
			}
		}
		return fmt.Errorf("worker %s not in the fleet", id)
	})
	return f
}

var beatSeq uint64

// beat publishes one heartbeat; a long interval keeps the worker in the fleet.
func (f *fakeWorker) beat(t *testing.T, models, adapters []string) {
	beatSeq++
	b, _ := json.Marshal(schemas.Heartbeat{Worker: f.id, Models: models, Adapters: adapters, MaxConcurrency: 8,
		Running: 1, Healthy: true, Engine: "sim", Version: "test", IntervalMS: 60000, Seq: beatSeq})
	if err := f.nc.Publish(schemas.HeartbeatSubject(f.id), b); err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeWorker) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ops...)
}

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   string
}

// do sends a request with the admin token (auth "" sends none).
func (w *world) do(method, path, body string) reply {
	return w.doAuth(method, path, body, "Bearer "+token)
}

func (w *world) doAuth(method, path, body, auth string) reply {
	w.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, w.url+path, rd)
	if err != nil {
		w.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// expect checks an answer's status and, for errors, that the body is
// OpenAI's error with code (if given) and param (if given).
func (r reply) expect(t *testing.T, what string, status int, code, param string) reply {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: status %d, want %d: %s", what, r.status, status, r.body)
	}
	if r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: Content-Type %q", what, r.header.Get("Content-Type"))
	}
	if status < 400 {
		return r
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || len(e.Error) != 4 || e.Error["message"] == "" || e.Error["type"] == "" {
		t.Fatalf("%s: not an OpenAI error: %s", what, r.body)
	}
	if code != "" && e.Error["code"] != code || param != "" && e.Error["param"] != param {
		t.Fatalf("%s: code %v param %v, want %s %s: %s", what, e.Error["code"], e.Error["param"], code, param, r.body)
	}
	return r
}

func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.body), v); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
}

// model is a model as the admin API shows it.
type model struct {
	Name        string   `json:"name"`
	Base        string   `json:"base"`
	Path        string   `json:"path"`
	MaxModelLen int      `json:"max_model_len"`
	Created     int64    `json:"created"`
	Status      string   `json:"status"`
	Workers     []string `json:"workers"`
}

type deletedModel struct {
	Deleted bool     `json:"deleted"`
	Removed []string `json:"removed"`
	Unload  []struct {
		Worker, Adapter string
		OK              bool
		Error           *struct{ Error map[string]any } `json:"error"`
	} `json:"unload"`
}

var routes = []struct{ method, path, body string }{
	{"GET", "/models", ""},
	{"POST", "/models", `{"name":"m"}`},
	{"GET", "/models/m", ""},
	{"DELETE", "/models/m", ""},
	{"POST", "/adapters", `{"name":"a","base":"m","path":"/p"}`},
	{"DELETE", "/adapters/a", ""},
	{"GET", "/workers", ""},
	{"POST", "/workers/w1/drain", ""},
	{"GET", "/workers/switches", ""},
	{"POST", "/workers/w1/switch", `{"model":"m"}`},
	{"POST", "/keys", `{"tenant":"t"}`},
	{"GET", "/keys", ""},
	{"DELETE", "/keys/key_x", ""},
	{"PATCH", "/keys/key_x", `{"weight":2}`},
	{"GET", "/usage", ""},
	{"GET", "/nothing-here", ""},
}

func TestAdminToken(t *testing.T) {
	w := newWorld(t)
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", "Basic " + token, token} {
		for _, r := range routes {
			got := w.doAuth(r.method, r.path, r.body, auth).expect(t, fmt.Sprintf("%s %s with %q", r.method, r.path, auth),
				401, schemas.ErrBadAdminToken.Code, "")
			if got.header.Get("WWW-Authenticate") == "" {
				t.Fatalf("no WWW-Authenticate on a 401")
			}
		}
	}
	if list, _ := w.store.Models(context.Background()); len(list) != 0 {
		t.Fatalf("unauthenticated requests wrote: %+v", list)
	}
	w.do("GET", "/nothing-here", "").expect(t, "unknown route", 404, "unknown_url", "")
	w.do("PUT", "/keys", "").expect(t, "wrong method", 405, "method_not_allowed", "")
	w.doAuth("GET", "/models", "", "bearer "+token).expect(t, "lower-case scheme", 200, "", "")
}

func TestModelsAndAdapters(t *testing.T) {
	w := newWorld(t)
	events := make(chan string, 100)
	if _, err := w.nc.Subscribe(registry.EventModels, func(m *nats.Msg) { events <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	event := func(want string) {
		t.Helper()
		select {
		case got := <-events:
			if got != want {
				t.Fatalf("event %q, want %q", got, want)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no event for %s", want)
		}
	}
	w1 := w.worker("w1", []string{"llama-8b"}, nil, false, false)

	var m model
	w.do("POST", "/models", `{"name":"llama-8b","max_model_len":8192,"owned_by":"meta"}`).expect(t, "create base", 201, "", "").decode(t, &m)
	if m.Name != "llama-8b" || m.MaxModelLen != 8192 || m.Status != admin.StatusServing || len(m.Workers) != 1 || m.Created == 0 {
		t.Fatalf("created %+v", m)
	}
	event("llama-8b")
	w.do("POST", "/models", `{"name":"llama-8b","max_model_len":4096}`).expect(t, "update base", 200, "", "").decode(t, &m)
	if m.MaxModelLen != 4096 {
		t.Fatalf("updated %+v", m)
	}
	event("llama-8b")
	w.do("POST", "/models", `{"name":"meta-llama/Llama-3.1-8B"}`).expect(t, "slashed name", 201, "", "").decode(t, &m)
	if m.Status != admin.StatusNoWorkers {
		t.Fatalf("unserved %+v", m)
	}
	event("meta-llama/Llama-3.1-8B")
	w.do("POST", "/adapters", `{"name":"lora-a","base":"llama-8b","path":"/w/a"}`).expect(t, "create adapter", 201, "", "").decode(t, &m)
	if m.Base != "llama-8b" || m.Path != "/w/a" || m.Status != admin.StatusAvailable {
		t.Fatalf("adapter %+v", m)
	}
	event("lora-a")
	w.do("POST", "/adapters", `{"name":"lora-a","base":"llama-8b","path":"/w/a"}`).expect(t, "same adapter again", 200, "", "")
	event("lora-a")

	for _, tc := range []struct {
		what, method, path, body string
		status                   int
		code, param              string
	}{
		{"empty body", "POST", "/models", "", 400, "", ""},
		{"not JSON", "POST", "/models", `{"name":`, 400, "", ""},
		{"array", "POST", "/models", `["x"]`, 400, "", ""},
		{"unknown field", "POST", "/models", `{"name":"x","base":"llama-8b"}`, 400, "", "base"},
		{"wrong type", "POST", "/models", `{"name":"x","max_model_len":"big"}`, 400, "", "max_model_len"},
		{"trailing data", "POST", "/models", `{"name":"x"} {}`, 400, "", ""},
		{"no name", "POST", "/models", `{"owned_by":"x"}`, 400, "", "name"},
		{"negative length", "POST", "/models", `{"name":"x","max_model_len":-1}`, 400, "", "max_model_len"},
		{"base named like an adapter", "POST", "/models", `{"name":"lora-a"}`, 409, schemas.ErrConflict.Code, ""},
		{"adapter on a missing base", "POST", "/adapters", `{"name":"x","base":"nope","path":"/p"}`, 400, "", "base"},
		{"adapter without path", "POST", "/adapters", `{"name":"x","base":"llama-8b"}`, 400, "", "path"},
		{"adapter with another path", "POST", "/adapters", `{"name":"lora-a","base":"llama-8b","path":"/other"}`, 409, schemas.ErrConflict.Code, ""},
		{"adapter named like a base", "POST", "/adapters", `{"name":"meta-llama/Llama-3.1-8B","base":"llama-8b","path":"/p"}`, 409, schemas.ErrConflict.Code, ""},
		{"unknown model", "GET", "/models/nope", "", 404, "model_not_found", ""},
		{"delete unknown model", "DELETE", "/models/nope", "", 404, "model_not_found", ""},
		{"delete a base with adapters", "DELETE", "/models/llama-8b", "", 409, schemas.ErrConflict.Code, ""},
		{"bad force", "DELETE", "/models/llama-8b?force=maybe", "", 400, "", "force"},
		{"delete a base as an adapter", "DELETE", "/adapters/llama-8b", "", 400, "", "name"},
		{"delete unknown adapter", "DELETE", "/adapters/nope", "", 404, "model_not_found", ""},
	} {
		w.do(tc.method, tc.path, tc.body).expect(t, tc.what, tc.status, tc.code, tc.param)
	}

	var all struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}
	w.do("GET", "/models", "").expect(t, "list", 200, "", "").decode(t, &all)
	if all.Object != "list" || len(all.Data) != 3 || all.Data[0].Name != "llama-8b" || all.Data[1].Name != "lora-a" ||
		all.Data[2].Name != "meta-llama/Llama-3.1-8B" {
		t.Fatalf("list %+v", all)
	}
	w.do("GET", "/models/meta-llama/Llama-3.1-8B", "").expect(t, "get slashed", 200, "", "").decode(t, &m)
	if m.Name != "meta-llama/Llama-3.1-8B" {
		t.Fatalf("got %+v", m)
	}
	w.do("GET", "/models/meta-llama%2FLlama-3.1-8B", "").expect(t, "get escaped", 200, "", "")

	// The adapter is loaded on w1 and on w2, whose engine refuses to unload.
	w1.beat(t, []string{"llama-8b", "lora-a"}, []string{"lora-a"})
	w2 := w.worker("w2", []string{"llama-8b", "lora-a"}, []string{"lora-a"}, false, true)
	testenv.WaitFor(t, 5*time.Second, func() error {
		w.do("GET", "/models/lora-a", "").expect(t, "loaded adapter", 200, "", "").decode(t, &m)
		if m.Status != admin.StatusLoaded || len(m.Workers) != 2 {
			return fmt.Errorf("%+v", m)
		}
		return nil
	})
	var del deletedModel
	w.do("DELETE", "/adapters/lora-a", "").expect(t, "delete adapter", 200, "", "").decode(t, &del)
	if !del.Deleted || len(del.Removed) != 1 || len(del.Unload) != 2 || !del.Unload[0].OK || del.Unload[0].Worker != "w1" ||
		del.Unload[1].OK || del.Unload[1].Error == nil {
		t.Fatalf("deleted %+v", del)
	}
	event("lora-a")
	if a := w1.asked(); len(a) != 1 || a[0] != schemas.CtlUnloadAdapter+" lora-a" {
		t.Fatalf("w1 was asked %q", a)
	}
	if a := w2.asked(); len(a) != 1 {
		t.Fatalf("w2 was asked %q", a)
	}
	w.do("DELETE", "/adapters/lora-a", "").expect(t, "delete adapter again", 404, "model_not_found", "")

	// A forced delete of a base removes its adapters and unloads them.
	w.do("POST", "/adapters", `{"name":"lora-b","base":"llama-8b","path":"/w/b"}`).expect(t, "adapter b", 201, "", "")
	event("lora-b")
	w1.beat(t, []string{"llama-8b", "lora-b"}, []string{"lora-b"})
	testenv.WaitFor(t, 5*time.Second, func() error {
		if ms := w.fleet.ModelsOf("w1"); len(ms) != 2 || ms[1] != "lora-b" {
			return fmt.Errorf("w1 serves %v", ms)
		}
		return nil
	})
	w.do("DELETE", "/models/llama-8b?force=true", "").expect(t, "forced delete", 200, "", "").decode(t, &del)
	if len(del.Removed) != 2 || del.Removed[0] != "llama-8b" || del.Removed[1] != "lora-b" || len(del.Unload) != 1 || !del.Unload[0].OK {
		t.Fatalf("forced delete %+v", del)
	}
	event("llama-8b")
	if a := w1.asked(); len(a) != 2 || a[1] != schemas.CtlUnloadAdapter+" lora-b" {
		t.Fatalf("w1 was asked %q", a)
	}
	w.do("DELETE", "/models/meta-llama/Llama-3.1-8B", "").expect(t, "delete slashed", 200, "", "")
	if list, _ := w.store.Models(context.Background()); len(list) != 0 {
		t.Fatalf("left %+v", list)
	}
}

func TestWorkers(t *testing.T) {
	w := newWorld(t)
	w1 := w.worker("w1", []string{"llama-8b", "lora-a"}, []string{"lora-a"}, false, false)
	w.worker("w2", []string{"llama-8b"}, nil, false, true)
	w.worker("w3", []string{"llama-8b"}, nil, true, false)
	var list struct {
		Data []struct {
			Worker         string   `json:"worker"`
			Models         []string `json:"models"`
			Adapters       []string `json:"adapters"`
			Load           int      `json:"load"`
			MaxConcurrency int      `json:"max_concurrency"`
			Draining       bool     `json:"draining"`
			LastSeen       string   `json:"last_seen"`
		} `json:"data"`
	}
	w.do("GET", "/workers", "").expect(t, "workers", 200, "", "").decode(t, &list)
	if len(list.Data) != 3 || list.Data[0].Worker != "w1" || len(list.Data[0].Adapters) != 1 || list.Data[0].Load != 1 ||
		list.Data[0].MaxConcurrency != 8 || list.Data[0].LastSeen == "" {
		t.Fatalf("workers %+v", list)
	}
	var d struct {
		Worker   string `json:"worker"`
		Draining bool   `json:"draining"`
	}
	w.do("POST", "/workers/w1/drain", "").expect(t, "drain", 200, "", "").decode(t, &d)
	if d.Worker != "w1" || !d.Draining || len(w1.asked()) != 1 || w1.asked()[0] != schemas.CtlDrain {
		t.Fatalf("drain %+v, asked %q", d, w1.asked())
	}
	w.do("POST", "/workers/nope/drain", "").expect(t, "drain unknown", 404, "worker_not_found", "")
	w.do("POST", "/workers/w2/drain", "").expect(t, "drain refused", 500, "internal_error", "")
	w.do("POST", "/workers/w3/drain", "").expect(t, "drain unanswered", 503, "worker_unreachable", "")
}

func TestKeysAndUsage(t *testing.T) {
	w := newWorld(t)
	keyEvents := make(chan string, 10)
	if _, err := w.nc.Subscribe(registry.EventKeys, func(m *nats.Msg) { keyEvents <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	type key struct {
		Object   string   `json:"object"`
		ID       string   `json:"id"`
		Key      string   `json:"key"`
		Name     string   `json:"name"`
		Tenant   string   `json:"tenant"`
		Models   []string `json:"models"`
		RPM      int      `json:"rpm"`
		TPM      int      `json:"tpm"`
		Redacted string   `json:"redacted_key"`
	}
	var k key
	w.do("POST", "/keys", `{"name":"ci","tenant":"acme","models":["llama-8b"],"rpm":3,"tpm":1000}`).
		expect(t, "create key", 201, "", "").decode(t, &k)
	if k.Object != "api_key" || !strings.HasPrefix(k.ID, "key_") || !strings.HasPrefix(k.Key, "tb-") || k.Tenant != "acme" ||
		len(k.Models) != 1 || k.RPM != 3 || k.TPM != 1000 || k.Redacted != "tb-..."+k.Key[len(k.Key)-4:] {
		t.Fatalf("created %+v", k)
	}
	if got, err := w.store.KeyByHash(context.Background(), registry.HashSecret(k.Key)); err != nil || got.ID != k.ID {
		t.Fatalf("the returned secret does not open the key: %+v %v", got, err)
	}
	var open key
	w.do("POST", "/keys", `{"tenant":"beta"}`).expect(t, "minimal key", 201, "", "").decode(t, &open)
	if open.Models == nil || len(open.Models) != 0 || open.RPM != 0 {
		t.Fatalf("minimal %+v", open)
	}

	for _, tc := range []struct{ what, body, param string }{
		{"no tenant", `{"name":"x"}`, "tenant"},
		{"negative rpm", `{"tenant":"t","rpm":-1}`, "rpm"},
		{"rpm not a number", `{"tenant":"t","rpm":"3"}`, "rpm"},
		{"models not a list", `{"tenant":"t","models":"llama-8b"}`, "models"},
		{"unknown field", `{"tenant":"t","secret":"x"}`, "secret"},
		{"unknown band", `{"tenant":"t","band":"urgent"}`, "band"},
		{"weight over 1000", `{"tenant":"t","weight":1001}`, "weight"},
		{"negative max_queue_ms", `{"tenant":"t","max_queue_ms":-1}`, "max_queue_ms"},
	} {
		w.do("POST", "/keys", tc.body).expect(t, tc.what, 400, "", tc.param)
	}

	// Flow control: PATCH changes band, weight, max_queue_ms and nothing else.
	var patched struct {
		key
		Band       string `json:"band"`
		Weight     int    `json:"weight"`
		MaxQueueMS int64  `json:"max_queue_ms"`
	}
	w.do("PATCH", "/keys/"+k.ID, `{"band":"batch","weight":3,"max_queue_ms":1500}`).expect(t, "patch key", 200, "", "").decode(t, &patched)
	if patched.Band != "batch" || patched.Weight != 3 || patched.MaxQueueMS != 1500 || patched.RPM != 3 || patched.Key != "" {
		t.Fatalf("patched %+v", patched)
	}
	w.do("PATCH", "/keys/"+k.ID, `{"band":"urgent"}`).expect(t, "patch to an unknown band", 400, "", "band")
	w.do("PATCH", "/keys/"+k.ID, `{"rpm":5}`).expect(t, "patch of a field not flow control's", 400, "", "rpm")
	w.do("PATCH", "/keys/key_none", `{"weight":2}`).expect(t, "patch of an unknown key", 404, "", "")

	r := w.do("GET", "/keys", "").expect(t, "list keys", 200, "", "")
	var list struct{ Data []key }
	r.decode(t, &list)
	if len(list.Data) != 2 || strings.Contains(r.body, k.Key) || strings.Contains(r.body, open.Key) || strings.Contains(r.body, `"hash"`) {
		t.Fatalf("list shows secrets or misses keys: %s", r.body)
	}

	w.do("DELETE", "/keys/"+k.ID, "").expect(t, "delete key", 200, "", "")
	select {
	case id := <-keyEvents:
		if id != k.ID {
			t.Fatalf("event for %q", id)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no key event")
	}
	w.do("DELETE", "/keys/"+k.ID, "").expect(t, "delete key again", 404, schemas.ErrKeyNotFound.Code, "")

	lim := registry.NewLimiter(w.store)
	ctx := context.Background()
	for _, u := range []struct {
		id, model string
		p, c      int
	}{{k.ID, "llama-8b", 10, 5}, {k.ID, "llama-8b", 1, 1}, {k.ID, "other", 3, 4}, {open.ID, "llama-8b", 2, 2}} {
		if _, err := lim.Record(ctx, schemas.UsageRecord{KeyID: u.id, Model: u.model, Usage: schemas.Usage{PromptTokens: u.p, CompletionTokens: u.c}}); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		KeyID            string `json:"key_id"`
		Model            string `json:"model"`
		Requests         int    `json:"requests"`
		PromptTokens     int    `json:"prompt_tokens"`
		CompletionTokens int    `json:"completion_tokens"`
	}
	for _, tc := range []struct {
		query string
		want  []row
	}{
		{"", []row{{k.ID, "llama-8b", 2, 11, 6}, {k.ID, "other", 1, 3, 4}, {open.ID, "llama-8b", 1, 2, 2}}},
		{"?key_id=" + k.ID + "&model=llama-8b", []row{{k.ID, "llama-8b", 2, 11, 6}}},
		{"?model=llama-8b", []row{{k.ID, "llama-8b", 2, 11, 6}, {open.ID, "llama-8b", 1, 2, 2}}},
		{"?key_id=key_nobody", []row{}},
		// per hour: all of it was this hour
		{"?by=hour", []row{{k.ID, "llama-8b", 2, 11, 6}, {k.ID, "other", 1, 3, 4}, {open.ID, "llama-8b", 1, 2, 2}}},
		{"?by=hour&hours=1&model=other", []row{{k.ID, "other", 1, 3, 4}}},
	} {
		var got struct {
			Object string `json:"object"`
			Data   []row  `json:"data"`
		}
		w.do("GET", "/usage"+tc.query, "").expect(t, "usage "+tc.query, 200, "", "").decode(t, &got)
		// Usage is sorted by key id (random here), then model.
		want := slices.Clone(tc.want)
		slices.SortStableFunc(want, func(a, b row) int { return strings.Compare(a.KeyID, b.KeyID) })
		if got.Object != "list" || fmt.Sprint(got.Data) != fmt.Sprint(want) {
			t.Fatalf("usage%s = %+v, want %+v", tc.query, got.Data, want)
		}
	}
	for _, q := range []string{"?by=day", "?by=hour&hours=0", "?by=hour&hours=193", "?by=hour&hours=x"} {
		w.do("GET", "/usage"+q, "").expect(t, "usage "+q, 400, "invalid_value", "")
	}
}

// Redis down: every route that needs it answers 503 (with Retry-After), the
// worker routes still answer, and all works again once Redis is back.
func TestRedisDown(t *testing.T) {
	w := newWorld(t)
	w.worker("w1", []string{"llama-8b"}, nil, false, false)
	w.redis.Stop()
	for _, r := range routes {
		if r.path == "/workers" || r.path == "/workers/w1/drain" || r.path == "/workers/switches" || r.path == "/workers/w1/switch" || r.path == "/nothing-here" {
			continue
		}
		got := w.do(r.method, r.path, r.body).expect(t, r.method+" "+r.path+" with Redis down", 503, schemas.ErrStoreUnavailable.Code, "")
		if got.header.Get("Retry-After") != "1" {
			t.Fatalf("%s %s: Retry-After %q", r.method, r.path, got.header.Get("Retry-After"))
		}
	}
	w.do("GET", "/workers", "").expect(t, "workers with Redis down", 200, "", "")
	w.redis.Restart(t)
	testenv.WaitFor(t, 10*time.Second, func() error {
		if r := w.do("POST", "/models", `{"name":"llama-8b"}`); r.status != 201 {
			return fmt.Errorf("%d %s", r.status, r.body)
		}
		return nil
	})
	w.do("POST", "/keys", `{"tenant":"t"}`).expect(t, "key after restart", 201, "", "")
}

// A DELETE /keys/{id} whose replicas did not confirm the deletion in time
// answers 503, and the key, deleted on the master, is announced all the
// same; a DELETE again answers 404.
func TestDeleteKeyNotReplicated(t *testing.T) {
	var greedy *registry.Store
	w := newWorld(t, func(c *admin.Config) {
		var err error
		greedy, err = registry.OpenTopology(context.Background(), registry.Topology{URL: "redis://" + c.Store.Client().(*redis.Client).Options().Addr, MinReplicas: 5, ReplicaTimeout: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c.Store = greedy
	})
	t.Cleanup(func() { greedy.Close() })
	keyEvents := make(chan string, 10)
	if _, err := w.nc.Subscribe(registry.EventKeys, func(m *nats.Msg) { keyEvents <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	k, _, err := w.store.CreateKey(context.Background(), registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	w.do("DELETE", "/keys/"+k.ID, "").expect(t, "delete key, not replicated", 503, "", "")
	select {
	case id := <-keyEvents:
		if id != k.ID {
			t.Fatalf("event for %q", id)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no key event for a deletion the replicas did not confirm")
	}
	if _, err := w.store.Key(context.Background(), k.ID); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("the key after its deletion: %v", err)
	}
	w.do("DELETE", "/keys/"+k.ID, "").expect(t, "delete key again", 404, schemas.ErrKeyNotFound.Code, "")
	select {
	case id := <-keyEvents:
		t.Fatalf("event for %q after a 404", id)
	case <-time.After(100 * time.Millisecond):
	}
}
