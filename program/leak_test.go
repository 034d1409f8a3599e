package program

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// No secret ever leaves: marker secrets planted in every header and body
// position of requests sent over TCP to a running gateway and admin API
// (real NATS with a password, real Redis, auth on) never appear in a
// response byte, a log line or /metrics.

// Markers: a key-shaped string that is no key, the admin token, the NATS
// password. leakWorld adds the secret of a real key. Each is recognised by
// a part the legitimate 401 message (which shows a key's first 6 and last 4
// characters) does not show.
const (
	keyMarker   = "tb-SECRETMARKERkey0123456789abcdefghijklmnopqrstuvwxyz"
	adminMarker = "ADMINMARKERtoken0123456789abcdef"
	natsMarker  = "NATSMARKERpassword0123456789abcd"
)

type leakWorld struct {
	gw         *Gateway
	log        *testenv.Buffer
	realKey    string   // a working API key
	needles    []string // what must never be seen
	sent       int
	variants   int
	logChecked int // bytes of the log FuzzNoSecretLeaks has searched
}

func startLeakWorld(t testing.TB) *leakWorld {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Username: "tokenbus", Password: natsMarker, MaxPayload: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	rd := testenv.StartRedis(t)
	ctx := context.Background()

	w := &leakWorld{log: &testenv.Buffer{}}
	log := slog.New(slog.NewJSONHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	natsOpts := DefaultGateway().NATS
	natsOpts.URL, natsOpts.User, natsOpts.Password = ns.ClientURL(), "tokenbus", natsMarker

	wc := DefaultWorker()
	wc.NATS, wc.Redis.URL, wc.Worker.ID, wc.Log = natsOpts, rd.URL, "w1", log
	fast(&wc.Engine)
	wk, err := StartWorker(ctx, wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })

	gc := DefaultGateway()
	gc.NATS, gc.Redis.URL, gc.Log = natsOpts, rd.URL, log
	gc.HTTP.Listen, gc.HTTP.Admin, gc.HTTP.AdminToken, gc.HTTP.Auth = "127.0.0.1:0", "127.0.0.1:0", adminMarker, true
	if w.gw, err = StartGateway(ctx, gc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.gw.Close() })

	store, err := registry.Open(ctx, rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	_, w.realKey, err = store.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	w.needles = []string{"SECRETMARKER", adminMarker, natsMarker[:12], w.realKey[6 : len(w.realKey)-4]}

	testenv.WaitFor(t, 10*time.Second, func() error {
		resp := exchange(t, w.gw.Addr(), "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+w.realKey+"\r\n\r\n")
		if !strings.Contains(resp, "llama-8b") {
			return fmt.Errorf("not serving yet: %.200q", resp)
		}
		return nil
	})
	return w
}

// exchange sends raw on a fresh connection, half-closes it (so the server
// reads EOF after it, not a timeout) and returns all the server sent within
// wait (a fuzzed request may ask for a long generation: then what came so
// far is returned), or fails the test at 10s.
func exchange(t testing.TB, addr, raw string, wait ...time.Duration) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := 10 * time.Second
	if len(wait) > 0 {
		deadline = wait[0]
	}
	_ = conn.SetDeadline(time.Now().Add(deadline))
	_, werr := io.WriteString(conn, raw)
	if werr == nil {
		_ = conn.(*net.TCPConn).CloseWrite()
	}
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && len(wait) == 0 {
		t.Fatalf("no end to the answer to %.120q: %.300q", raw, got)
	}
	return string(got)
}

// check sends raw (after planting) to addr and fails on any needle in the
// answer (wait as for exchange).
func (w *leakWorld) check(t testing.TB, addr, raw string, wait ...time.Duration) {
	t.Helper()
	w.sent++
	resp := exchange(t, addr, raw, wait...)
	for _, n := range w.needles {
		if strings.Contains(resp, n) {
			t.Errorf("response leaks %q\nrequest: %.300q\nresponse: %q", n, raw, resp)
		}
	}
}

// checkLog fails on any needle in the log so far (and checks the log is
// JSON lines and has request lines, so a silent log cannot pass).
func (w *leakWorld) checkLog(t testing.TB) {
	t.Helper()
	log := w.log.String()
	lines, err := testenv.ParseJSONLog([]byte(log))
	if err != nil {
		t.Fatalf("log is not JSON lines: %v", err)
	}
	requests, unparsed := 0, 0
	for _, l := range lines {
		if l["msg"] != "request" {
			continue
		}
		requests++
		// The real method, or "-" for a request fasthttp could not parse
		// (it used to say GET, its default, for a POST).
		if route := fmt.Sprint(l["route"]); strings.HasSuffix(route, "completions") && l["method"] != "POST" {
			t.Errorf("completion logged with method %v: %v", l["method"], l)
		}
		if l["route"] == "unmatched" && l["method"] == "-" {
			unparsed++
		}
	}
	if unparsed == 0 {
		t.Error("no unparsed request in the log: the method check saw none")
	}
	if requests < w.sent/2 {
		t.Fatalf("only %d request log lines for %d requests: the check would see little", requests, w.sent)
	}
	for _, line := range strings.Split(log, "\n") {
		for _, n := range w.needles {
			if strings.Contains(line, n) {
				t.Errorf("log line leaks %q: %s", n, line)
			}
		}
	}
}

// leakVariants is every request the test plants secrets in: "$S" stands
// for the secret, "$K" for the working key. Each is sent with each secret.
func leakVariants() []string {
	const (
		chat  = `{"model":"llama-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
		compl = `{"model":"llama-8b","prompt":"hi","max_tokens":2}`
	)
	post := func(path, auth, extra, body string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
			path, auth, extra, len(body), body)
	}
	get := func(path, headers string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n"
	}
	var v []string
	// The secret in the Authorization header, every scheme and shape.
	for _, auth := range []string{
		"Authorization: Bearer $S\r\n", "Authorization: bearer $S\r\n", "Authorization: BEARER  $S \r\n",
		"Authorization: $S\r\n", "Authorization: Basic $S\r\n", "Authorization: Token $S\r\n",
		"Authorization: Bearer $S extra\r\n", "Authorization: Bearer\t$S\r\n", "Authorization: Bearer $S\xff\xfe\r\n",
		"Authorization: Bearer $K\r\nAuthorization: Bearer $S\r\n", "Authorization: Bearer $S\r\nAuthorization: Bearer $K\r\n",
		"Authorization: Bearer $S\r\nAuthorization: Bearer $S\r\n",
		"Authorization: Bearer $S\r\nThis is no header line\r\n", // the original finding
		"Authorization: Bearer $S\r\n: no name\r\n", "Authorization: Bearer $S\r\nBad Name: x\r\n",
		"Authorization: Bearer\r\n $S\r\n", // obs-fold
		"Authorization: Bearer $S\r\nContent-Length: 3\r\n", "Authorization: Bearer $S\r\nTransfer-Encoding: gzip\r\n",
		"Authorization: Bearer $S\rX: y\r\n",                                         // bare CR
		"Authorization: Bearer $S\r\nX-Big: " + strings.Repeat("a", 12<<10) + "\r\n", // headers too large
		"X-Big: " + strings.Repeat("a", 12<<10) + "\r\nAuthorization: Bearer $S\r\n",
		"Authorization: Bearer $S\r\nContent-Encoding: gzip\r\n",
		"Authorization: Bearer $S\r\nContent-Type: text/plain\r\n",
		"Authorization: Bearer $S\r\nX-Request-Id: $S\r\n", "Authorization: Bearer $S\r\nExpect: 100-continue\r\n",
	} {
		v = append(v, post("/v1/chat/completions", auth, "", chat), post("/v1/completions", auth, "", compl),
			get("/v1/models", auth), get("/v1/models/llama-8b", auth),
			post("/predictions/llama-8b/1.0/v1/completions", auth, "", compl))
		// Bare LF line endings throughout.
		v = append(v, strings.ReplaceAll(post("/v1/completions", auth, "", compl), "\r\n", "\n"))
	}
	// The secret in other headers, with the working key: the request goes
	// all the way to the worker.
	for _, h := range []string{
		"X-Api-Key: $S\r\n", "Api-Key: $S\r\n", "Cookie: session=$S\r\n", "X-Request-Id: $S\r\n",
		"Traceparent: 00-$S-01\r\n", "User-Agent: $S\r\n", "Tb-Model: $S\r\n", "Tb-Tenant: $S\r\n",
		"X-Forwarded-For: $S\r\n", "Proxy-Authorization: Basic $S\r\n", "OpenAI-Organization: $S\r\n",
		"$S: header-name\r\n", "X-$S: header-name\r\n", "Referer: http://u:$S@host/\r\n",
		"X-Note: a\r\n $S\r\n", "X-Note: $S\xff\r\n", "Content-Type: application/json; $S\r\n",
		"Content-Length: 1\r\n", "Connection: $S\r\n", "Host: $S\r\n",
	} {
		v = append(v, post("/v1/chat/completions", "Authorization: Bearer $K\r\n", h, chat),
			post("/v1/completions", "Authorization: Bearer $K\r\n", h, compl),
			get("/v1/models", "Authorization: Bearer $K\r\n"+h))
	}
	// The secret in the request line.
	for _, line := range []string{
		"GET /v1/$S HTTP/1.1", "GET /v1/models/$S HTTP/1.1", "GET /v1/models?api_key=$S HTTP/1.1",
		"POST /v1/chat/completions?key=$S HTTP/1.1", "GET /$S HTTP/1.1", "$S /v1/models HTTP/1.1",
		"GET /v1/models HTTP/$S", "GET /v1/models/$S/x?y=$S#$S HTTP/1.1", "GET /v1/%24S$S HTTP/1.1",
		"GET http://h/$S HTTP/1.1", "POST /predictions/$S/1.0/v1/completions HTTP/1.1", "DELETE /v1/models/$S HTTP/1.1",
		"GET /v1/models\xff$S HTTP/1.1", "GET /v1/models $S HTTP/1.1", "GET  /v1/models?$S HTTP/1.1",
	} {
		v = append(v, line+"\r\nHost: x\r\nAuthorization: Bearer $K\r\nContent-Type: application/json\r\nContent-Length: "+
			fmt.Sprint(len(compl))+"\r\n\r\n"+compl)
	}
	// The secret in the body, with the working key.
	for _, body := range []string{
		`{"model":"$S","prompt":"hi","max_tokens":2}`, `{"model":"llama-8b","prompt":"$S","max_tokens":2}`,
		`{"model":"llama-8b","prompt":"hi","max_tokens":2,"user":"$S"}`, `{"model":"llama-8b","prompt":"hi","$S":1}`,
		`{"model":"llama-8b","prompt":"hi","max_tokens":"$S"}`, `{"model":"llama-8b","prompt":"hi","stop":["$S"],"max_tokens":2}`,
		`{"model":"llama-8b","prompt":"hi","max_tokens":2,"stream":true,"user":"$S"}`,
		`{"model":"llama-8b","prompt":"hi","max_tokens":2,"stream":"$S"}`, `{"model":"llama-8b","prompt":"hi","n":"$S"}`,
		`{"model":"llama-8b","prompt":"hi","logit_bias":{"$S":1}}`, `{"model":"llama-8b","prompt":"hi","response_format":{"type":"$S"}}`,
		`{"model":"llama-8b","prompt":"hi","max_tokens":2}$S`, `{"model":"$S"`, `{$S}`, `$S`, `["$S"]`, `{"model":"llama-8b","prompt":"\xff$S"}`,
		`{"model":"llama-8b","prompt":"hi` + "\x00" + `$S"}`, `{"model":"llama-8b","prompt":"hi","priority":"$S"}`,
		`{"model":"llama-8b","prompt":"hi","model":"$S"}`, `{"model":"llama-8b","prompt":"hi","max_tokens":-1,"suffix":"$S"}`,
	} {
		chatBody := strings.Replace(body, `"prompt":"hi"`, `"messages":[{"role":"user","content":"hi"}]`, 1)
		chatBody = strings.Replace(chatBody, `"prompt":"$S"`, `"messages":[{"role":"$S","content":"$S"}]`, 1)
		v = append(v, post("/v1/completions", "Authorization: Bearer $K\r\n", "", body),
			post("/v1/chat/completions", "Authorization: Bearer $K\r\n", "", chatBody),
			post("/predictions/$S/1.0/v1/completions", "Authorization: Bearer $K\r\n", "", body))
	}
	// Bodies over the limit, chunked, and a body that ends early.
	big := `{"model":"llama-8b","prompt":"$S` + strings.Repeat("x", 9<<20) + `"}`
	v = append(v, post("/v1/completions", "Authorization: Bearer $S\r\n", "", big),
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer $S\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n$S\r\n0\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer $K\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"$S\r\n0\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer $S\r\nContent-Length: 900\r\n\r\n{\"model\":\"$S\"")
	return v
}

// adminVariants: the admin API, the secret as the token and in the body.
func adminVariants() []string {
	var v []string
	for _, auth := range []string{
		"Authorization: Bearer $S\r\n", "Authorization: $S\r\n", "Authorization: Basic $S\r\n",
		"Authorization: Bearer $S\r\nBad header line\r\n", "Authorization: Bearer $S\r\nContent-Length: 1\r\nContent-Length: 2\r\n",
		"Authorization: Bearer $A\r\nX-Note: $S\r\n", "Authorization: Bearer $A\r\n$S: x\r\n",
		"Authorization: Bearer $S\r\nX-Big: " + strings.Repeat("a", 12<<10) + "\r\n",
	} {
		for _, req := range []string{"GET /keys HTTP/1.1", "GET /models/$S HTTP/1.1", "DELETE /keys/$S HTTP/1.1", "GET /$S?t=$S HTTP/1.1"} {
			v = append(v, req+"\r\nHost: x\r\n"+auth+"\r\n")
		}
		for _, body := range []string{`{"tenant":"$S","name":"$S"}`, `{"$S":1}`, `{"tenant":"$S"`, `{"models":"$S"}`} {
			v = append(v, fmt.Sprintf("POST /keys HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				auth, len(body), body))
		}
	}
	return v
}

// plant replaces the placeholders.
func (w *leakWorld) plant(raw, secret string) string {
	return strings.NewReplacer("$S", secret, "$K", w.realKey, "$A", adminMarker).Replace(raw)
}

func (w *leakWorld) secrets() []string {
	return []string{keyMarker, adminMarker, natsMarker, w.realKey}
}

func TestNoSecretLeaks(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	w := startLeakWorld(t)
	for _, raw := range leakVariants() {
		for _, s := range w.secrets() {
			w.variants++
			w.check(t, w.gw.Addr(), w.plant(raw, s))
		}
	}
	for _, raw := range adminVariants() {
		for _, s := range w.secrets() {
			w.variants++
			w.check(t, w.gw.AdminAddr(), w.plant(raw, s))
		}
	}
	// What was said about those requests: metrics and the log.
	w.check(t, w.gw.Addr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
	w.checkLog(t)
	t.Logf("%d variants sent over TCP (%d requests), %d log bytes checked", w.variants, w.sent, len(w.log.String()))
	if w.variants < 300 {
		t.Fatalf("only %d variants", w.variants)
	}
}

// FuzzNoSecretLeaks mutates the requests of TestNoSecretLeaks: "$S" in the
// input becomes each secret in turn.
func FuzzNoSecretLeaks(f *testing.F) {
	for _, raw := range leakVariants() {
		if len(raw) < 64<<10 {
			f.Add(raw, false)
		}
	}
	for _, raw := range adminVariants() {
		f.Add(raw, true)
	}
	w := startLeakWorld(f)
	f.Fuzz(func(t *testing.T, raw string, admin bool) {
		addr := w.gw.Addr()
		if admin {
			addr = w.gw.AdminAddr()
		}
		for _, s := range w.secrets() {
			w.check(t, addr, w.plant(raw, s), time.Second)
		}
		log := w.log.String()
		fresh := log[w.logChecked:] // slog writes whole lines: no needle straddles
		w.logChecked = len(log)
		for _, n := range w.needles {
			if strings.Contains(fresh, n) {
				t.Fatalf("log leaks %q after %.300q", n, raw)
			}
		}
	})
}
