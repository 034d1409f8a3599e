package program

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// Hostile ids against every route: each path parameter of every route of the
// OpenAI API and the admin API (read from the running apps, so a new route is
// covered without touching this test), and every id that travels in a body, a
// header or a query, replaced by hostile values. Against a real nats-server
// and redis-server: an id reaches NATS subjects and JetStream keys, and a
// subject longer than the server's control line makes it close the
// connection that sent it (a 3,100-byte file id stopped the gateway).
//
// After every request: an answer under 500, OpenAI-shaped when it is JSON,
// and the gateway still on the NATS connection it started with (never
// closed, never reconnected). At the end a chat completion still streams.

// hostileIDs are the values every parameter is tried with.
func hostileIDs() []string {
	long := func(prefix string, n int) string { return prefix + strings.Repeat("a", n) }
	return []string{
		long("file-", 3100), long("batch_", 3100), long("resp_", 3100), long("cs_", 3100), long("", 3100),
		long("file-", 65), long("batch_", 60), // one byte past the longest valid id
		"file-a.b", "batch_a.b", "resp_a.b", "a.b.c", "*", ">", "a.*", "a.>", "a b", "a\tb", "a\x00b", "a\r\nb",
		"é", "\xff\xfe", "../../etc/passwd", "..", "%2e%2e", "$JS.API.STREAM.DELETE.TOKENBUS_FILES",
		"$KV.TOKENBUS_BATCHES.>", "_INBOX.>", "tokenbus.v1.ctl.w1.drain", strings.Repeat(".", 1500),
	}
}

// hostileBodies are requests whose ids or names travel in the body, a header
// or the query; x is the hostile value (huge ones are built here).
func hostileBodies(x, fileID string) []hostileRequest {
	q := url.QueryEscape(x)
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	chat := func(model string) string {
		return js(map[string]any{"model": model, "max_tokens": 2, "messages": []any{map[string]string{"role": "user", "content": "hi"}}})
	}
	return []hostileRequest{
		{"POST", "/v1/batches", js(map[string]any{"input_file_id": x, "endpoint": "/v1/chat/completions", "completion_window": "24h"}), nil},
		{"POST", "/v1/batches", js(map[string]any{"input_file_id": fileID, "endpoint": "/v1/chat/completions",
			"completion_window": "24h", "metadata": map[string]string{x: x}}), nil},
		{"POST", "/v1/responses", js(map[string]any{"model": "llama-8b", "input": "hi", "previous_response_id": x}), nil},
		{"POST", "/v1/responses", js(map[string]any{"model": x, "input": "hi"}), nil},
		{"POST", "/v1/responses", js(map[string]any{"model": "llama-8b", "input": "hi", "metadata": map[string]string{x: x}}), nil},
		{"POST", "/v1/chat/completions", chat(x), nil},
		{"POST", "/v1/chat/completions", chat("llama-8b"), []string{"Last-Event-ID: " + x + ":1"}},
		{"POST", "/v1/chat/completions", chat("llama-8b"), []string{"Last-Event-ID: cs_" + x + ":1"}},
		{"POST", "/v1/completions", js(map[string]any{"model": x, "prompt": "hi", "max_tokens": 1}), nil},
		{"POST", "/v1/embeddings", js(map[string]any{"model": x, "input": "hi"}), nil},
		{"GET", "/v1/files?after=" + q + "&purpose=" + q, "", nil},
		{"GET", "/v1/batches?after=" + q, "", nil},
		{"GET", "/v1/responses/resp_nope?stream=true&starting_after=" + q, "", nil},
		{"GET", "/v1/models/" + url.PathEscape(x), "", []string{"X-Request-Id: " + x}},
		{"admin:GET", "/usage?key_id=" + q + "&model=" + q, "", nil},
		{"admin:GET", "/usage?by=hour&hours=1&key_id=" + q, "", nil},
		{"admin:POST", "/models", js(map[string]any{"name": x}), nil},
		{"admin:POST", "/adapters", js(map[string]any{"name": x, "base": x, "path": x}), nil},
		{"admin:POST", "/keys", js(map[string]any{"tenant": x, "name": x, "models": []string{x}}), nil},
	}
}

type hostileRequest struct {
	method, path, body string
	hdr                []string // "Name: value"
}

// routesWithParams lists the app's routes that take a path parameter, with
// every parameter replaced by x (path-escaped).
func routesWithParams(app *fiber.App, x string) []hostileRequest {
	var out []hostileRequest
	seen := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		if len(r.Params) == 0 || r.Method == fiber.MethodHead || r.Method == fiber.MethodOptions {
			continue
		}
		var b strings.Builder
		for i, seg := range strings.Split(r.Path, "/") {
			if i > 0 {
				b.WriteByte('/')
			}
			if strings.HasPrefix(seg, ":") || seg == "*" || strings.HasSuffix(seg, "*") {
				b.WriteString(url.PathEscape(x))
				continue
			}
			b.WriteString(seg)
		}
		k := r.Method + " " + b.String()
		if seen[k] {
			continue
		}
		seen[k] = true
		body := ""
		if r.Method == fiber.MethodPost {
			body = "{}"
		}
		out = append(out, hostileRequest{method: r.Method, path: b.String(), body: body})
	}
	return out
}

// hostileWorld is a gateway with auth, the Files, Batches and Responses APIs
// and the admin API on a real nats-server and redis-server, with one key.
type hostileWorld struct {
	*edgeWorld
	key         string
	base, admin string
	file        string // a batch input file of the key's tenant
}

func startHostileWorld(t testing.TB) *hostileWorld {
	w := &hostileWorld{edgeWorld: startEdgeWorld(t, "")}
	w.key = w.edgeWorld.key(t)
	w.base, w.admin = "http://"+w.gw.Addr(), "http://"+w.gw.AdminAddr()
	if w.gw.run().g == nil || w.gw.run().adm == nil {
		t.Fatal("the gateway runs without its API or admin API")
	}
	if !w.gw.run().nc.IsConnected() || w.gw.run().nc.Stats().Reconnects != 0 {
		t.Fatal("the gateway is not on its first connection")
	}
	// JetStream stores on: without them the files, batches and responses
	// routes would answer without reaching NATS, and test nothing.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write([]byte(`{"custom_id":"1","method":"POST","url":"/v1/chat/completions","body":{"model":"llama-8b","messages":[{"role":"user","content":"hi"}]}}` + "\n"))
	_ = mw.Close()
	req := mustRequest(t, "POST", w.base+"/v1/files", "Authorization: Bearer "+w.key, "Content-Type: "+mw.FormDataContentType())
	req.Body = io.NopCloser(&body)
	req.ContentLength = int64(body.Len())
	resp, err := w.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var f struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &f) != nil || f.ID == "" {
		t.Fatalf("POST /v1/files: %d %s", resp.StatusCode, b)
	}
	w.file = f.ID
	return w
}

// send sends r with the tenant's key (or the admin token) and checks the
// answer and the gateway's connection.
func (w *hostileWorld) send(t *testing.T, r hostileRequest) (status int, body string) {
	t.Helper()
	base, auth := w.base, "Authorization: Bearer "+w.key
	method := r.method
	if m, ok := strings.CutPrefix(method, "admin:"); ok {
		method, base, auth = m, w.admin, "Authorization: Bearer "+edgeAdminToken
	}
	req, err := http.NewRequest(method, base+r.path, strings.NewReader(r.body))
	if err != nil {
		return 0, "" // a value net/http will not send (a control character in a header): nothing reaches the gateway
	}
	k, v, _ := strings.Cut(auth, ": ")
	req.Header.Set(k, v)
	for _, h := range r.hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := w.http.Do(req)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "invalid header field value") || strings.Contains(msg, "invalid URL"):
			return 0, "" // net/http would not send it
		case len(r.path)+headerBytes(r.hdr) > 4096 && (strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe")):
			return 0, "" // past the server's header buffer: fasthttp answers and closes while the client still writes
		}
		t.Fatalf("%s %s: %s", method, clipForLog(r.path), clipForLog(msg))
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	what := method + " " + clipForLog(r.path) + " " + clipForLog(r.body)
	if resp.StatusCode >= 500 {
		t.Errorf("%s: %d %s", what, resp.StatusCode, clipForLog(string(b)))
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && resp.StatusCode >= 400 {
		var e struct {
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: %d, not an OpenAI error body: %s", what, resp.StatusCode, clipForLog(string(b)))
		} else if len(e.Error.Message) > 2048 {
			t.Errorf("%s: the error quotes %d bytes", what, len(e.Error.Message))
		}
	}
	if !w.gw.run().nc.IsConnected() || w.gw.run().nc.Stats().Reconnects != 0 {
		t.Fatalf("%s: the gateway lost its NATS connection (closed %v, last error %v)", what, w.gw.run().nc.IsClosed(), w.gw.run().nc.LastError())
	}
	select {
	case <-w.gw.Done():
		t.Fatalf("%s: the gateway stopped: %v", what, w.gw.Wait())
	default:
	}
	return resp.StatusCode, string(b)
}

// alive checks that a chat completion still streams through the gateway.
func (w *hostileWorld) alive(t *testing.T) {
	t.Helper()
	st, _, body := w.do(t, "POST", w.base+"/v1/chat/completions",
		`{"model":"llama-8b","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`,
		"Authorization: Bearer "+w.key)
	if st != 200 || !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("after the hostile requests a chat stream fails: %d %s", st, clipForLog(body))
	}
}

func mustRequest(t testing.TB, method, url string, hdr ...string) *http.Request {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	return req
}

func headerBytes(hdr []string) int {
	n := 0
	for _, h := range hdr {
		n += len(h)
	}
	return n
}

func clipForLog(s string) string {
	if len(s) > 120 {
		return s[:120] + fmt.Sprintf("…(%d bytes)", len(s))
	}
	return s
}

func TestHostileIDsOnEveryRoute(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	w := startHostileWorld(t)
	apps := map[string]*fiber.App{"": w.gw.run().g.App(), "admin:": w.gw.run().adm.App()}
	n := 0
	for _, x := range hostileIDs() {
		for prefix, app := range apps {
			for _, r := range routesWithParams(app, x) {
				r.method = prefix + r.method
				w.send(t, r)
				n++
			}
		}
	}
	for _, x := range append(hostileIDs(), strings.Repeat("b", 100_000)) {
		for _, r := range hostileBodies(x, w.file) {
			w.send(t, r)
			n++
		}
	}
	if n < 500 {
		t.Fatalf("only %d requests: the routes were not found", n)
	}
	t.Logf("%d hostile requests", n)
	w.alive(t)
}

// Huge values in bodies are refused with the right status and a short
// message, before anything is stored.
func TestHostileValuesRefused(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	w := startHostileWorld(t)
	x := strings.Repeat("b", 100_000)
	for i, want := range map[int]int{0: 404, 1: 400, 2: 404, 3: 404, 4: 400, 5: 404, 8: 404, 9: 404} {
		r := hostileBodies(x, w.file)[i]
		if st, body := w.send(t, r); st != want {
			t.Errorf("%s %s %s: %d %s, want %d", r.method, r.path, clipForLog(r.body), st, clipForLog(body), want)
		}
	}
}

// FuzzHostileIDs drives the same routes with generated ids (go test -fuzz
// FuzzHostileIDs ./program); in a plain test run its seeds run.
func FuzzHostileIDs(f *testing.F) {
	for _, x := range []string{"file-" + strings.Repeat("z", 3000), "a.b", "*", ">", "resp_x y"} {
		f.Add(x)
	}
	w := startHostileWorld(f)
	f.Fuzz(func(t *testing.T, x string) {
		for _, r := range routesWithParams(w.gw.run().g.App(), x) {
			w.send(t, r)
		}
		for _, r := range routesWithParams(w.gw.run().adm.App(), x) {
			r.method = "admin:" + r.method
			w.send(t, r)
		}
		for _, r := range hostileBodies(x, w.file) {
			w.send(t, r)
		}
	})
}

// A NATS-native request whose reply subject is long enough that a
// dispatcher's or worker's own protocol line carrying it would pass the
// server's control line (a worker id longer than the request's subject) is
// dropped by the dispatcher, whose connection stays up; before, forwarding
// it made the server close the dispatcher's connection.
func TestLongReplySubjectDropped(t *testing.T) {
	ns := testenv.NATS(t)
	ctx := context.Background()
	dc := DefaultDispatcher()
	dc.NATS.URL, dc.Redis.URL = ns.ClientURL(), ""
	d, err := StartDispatcher(ctx, dc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	wc := DefaultWorker()
	wc.NATS.URL, wc.Worker.ID = ns.ClientURL(), "w-"+strings.Repeat("h", 250) // a long host name
	fast(&wc.Engine)
	w, err := StartWorker(ctx, wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	nc := testenv.Connect(t, ns)
	testenv.WaitFor(t, 10*time.Second, func() error {
		if d.run().d.Fleet().Len() != 1 {
			return fmt.Errorf("the dispatcher does not know the worker yet")
		}
		return nil
	})
	send := func(reply string) {
		m := nats.NewMsg(schemas.ReqSubject("llama-8b"))
		m.Reply = reply
		m.Header.Set(schemas.HdrRequestID, "req-long-reply")
		m.Header.Set(schemas.HdrKind, string(schemas.KindChat))
		m.Data = []byte(`{"model":"llama-8b","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Under the server's control line as the client sends it, over it as
	// the dispatcher would forward it to the worker.
	reply := "_INBOX." + strings.Repeat("r", 4096-len("HPUB "+schemas.ReqSubject("llama-8b")+"  1000 10000\r\n")-len("_INBOX.")-20)
	send(reply)
	ok := nats.NewInbox()
	sub, err := nc.SubscribeSync(ok + ".>")
	if err != nil {
		t.Fatal(err)
	}
	send(ok + ".1")
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("a normal request after the long one got no answer: %v", err)
	}
	dnc := d.run().conn()
	if dnc.IsClosed() || dnc.Stats().Reconnects != 0 || dnc.LastError() != nil {
		t.Fatalf("the dispatcher's connection: closed %v, reconnects %d, error %v", dnc.IsClosed(), dnc.Stats().Reconnects, dnc.LastError())
	}
}
