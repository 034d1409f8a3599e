package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// CORS through real HTTP: preflights answered before routing and
// authentication, Allow-Origin on every kind of response (success, handler
// error, unknown route, fasthttp's own 413, an SSE stream on a hijacked
// connection), credentials per the spec, disallowed origins left without.
func TestCORS(t *testing.T) {
	const page, evil = "https://app.example", "https://evil.example"
	anyOrigin := CORSConfig{Origins: []string{"*"}, Methods: []string{"*"}, Headers: []string{"*"}}
	listed := CORSConfig{Origins: []string{"https://App.example/"}}
	anyCreds := CORSConfig{Origins: []string{"*"}, Credentials: true}
	listedCreds := CORSConfig{Origins: []string{page}, Credentials: true, Methods: []string{"get", "POST"},
		Headers: []string{"Authorization", "Content-Type"}, MaxAge: time.Minute}

	type want struct {
		status      int
		origin      string // Access-Control-Allow-Origin; "" none
		credentials bool
		methods     string // Access-Control-Allow-Methods; "" none
		headers     string // Access-Control-Allow-Headers; "" none
		maxAge      string
		varyOrigin  bool
		expose      bool   // Access-Control-Expose-Headers lists X-Request-Id
		body        string // prefix of the body; "" unchecked
	}
	preflight := func(path, origin, method, headers string) *http.Request {
		r, _ := http.NewRequest(http.MethodOptions, path, nil)
		r.Header.Set("Origin", origin)
		r.Header.Set("Access-Control-Request-Method", method)
		if headers != "" {
			r.Header.Set("Access-Control-Request-Headers", headers)
		}
		return r
	}
	post := func(path, origin, body string) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		return r
	}
	get := func(path, origin string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Origin", origin)
		return r
	}
	cases := []struct {
		name string
		cfg  CORSConfig
		req  *http.Request
		want want
	}{
		{"preflight, any origin", anyOrigin, preflight("/v1/chat/completions", page, "POST", "authorization, content-type"),
			want{status: 204, origin: "*", methods: "POST", headers: "authorization, content-type", maxAge: "600"}},
		{"preflight of a TorchServe route", anyOrigin, preflight("/predictions/llama-8b/1.0/v1/completions", page, "POST", "content-type"),
			want{status: 204, origin: "*", methods: "POST", headers: "content-type", maxAge: "600"}},
		{"preflight of a route added later (unknown today)", anyOrigin, preflight("/v1/something-new", page, "POST", ""),
			want{status: 204, origin: "*", methods: "POST", maxAge: "600"}},
		{"preflight of models is not 401'd", anyOrigin, preflight("/v1/models", page, "GET", "authorization"),
			want{status: 204, origin: "*", methods: "GET", headers: "authorization", maxAge: "600"}},
		{"preflight, listed origin echoed as sent", listed, preflight("/v1/completions", page, "POST", "content-type"),
			want{status: 204, origin: page, methods: "POST", headers: "content-type", maxAge: "600", varyOrigin: true}},
		{"preflight, disallowed origin", listed, preflight("/v1/completions", evil, "POST", "content-type"),
			want{status: 204, varyOrigin: true}},
		{"preflight, credentials with any origin: echoed, never *", anyCreds, preflight("/v1/completions", evil, "POST", "authorization"),
			want{status: 204, origin: evil, credentials: true, methods: "POST", headers: "authorization", maxAge: "600", varyOrigin: true}},
		{"preflight, configured lists", listedCreds, preflight("/v1/completions", page, "PUT", "x-other"),
			want{status: 204, origin: page, credentials: true, methods: "GET, POST", headers: "authorization, content-type", maxAge: "60", varyOrigin: true}},
		{"CORS off: OPTIONS is a 405", CORSConfig{}, preflight("/v1/completions", page, "POST", ""),
			want{status: 405, body: `{"error":`}},
		{"OPTIONS without Access-Control-Request-Method is no preflight", anyOrigin, func() *http.Request {
			r := preflight("/v1/completions", page, "POST", "")
			r.Header.Del("Access-Control-Request-Method")
			return r
		}(), want{status: 405, origin: "*", expose: true, body: `{"error":`}},

		{"stream", anyOrigin, post("/v1/chat/completions", page, chatBody),
			want{status: 200, origin: "*", expose: true, body: standardSSE(chatFrames)}},
		{"stream, credentials", listedCreds, post("/v1/chat/completions", page, chatBody),
			want{status: 200, origin: page, credentials: true, varyOrigin: true, expose: true, body: standardSSE(chatFrames)}},
		{"unary", listed, post("/v1/chat/completions", page, unaryBody),
			want{status: 200, origin: page, varyOrigin: true, expose: true, body: chatFull}},
		{"disallowed origin: served, no header", listed, post("/v1/chat/completions", evil, unaryBody),
			want{status: 200, varyOrigin: true, body: chatFull}},
		{"no Origin: no header", anyOrigin, post("/v1/chat/completions", "", unaryBody),
			want{status: 200, body: chatFull}},
		{"handler error", anyOrigin, post("/v1/chat/completions", page, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`),
			want{status: 404, origin: "*", expose: true, body: `{"error":`}},
		{"unknown route", anyOrigin, get("/v2/nothing", page),
			want{status: 404, origin: "*", expose: true, body: `{"error":`}},
		{"authorization error", anyOrigin, func() *http.Request {
			r := post("/v1/completions", page, promptBody)
			r.Header.Set("X-Deny", "1")
			return r
		}(),
			want{status: 401, origin: "*", expose: true, body: `{"error":`}},
		{"body over the limit (fasthttp's 413)", anyOrigin, post("/v1/completions", page, `{"prompt":"`+strings.Repeat("x", 8<<10)+`"}`),
			want{status: 413, origin: "*", expose: true, body: `{"error":`}},
		{"/version", anyOrigin, get("/version", page),
			want{status: 200, origin: "*", expose: true, body: `{"version":"1.2.3-test"}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var authorized atomic.Int32
			cfg := Config{CORS: tc.cfg, BodyLimit: 4 << 10, Version: "1.2.3-test",
				Authorize: func(c *fiber.Ctx, req *schemas.Request) (Principal, error) {
					authorized.Add(1)
					if c.Get("X-Deny") != "" {
						return Principal{}, schemas.ErrMissingKey.New()
					}
					return Principal{}, nil
				},
				ModelAccess: func(c *fiber.Ctx) (func(string) bool, error) {
					return nil, schemas.ErrMissingKey.New()
				}}
			h := newHarness(t, harnessOptions{cfg: cfg})
			u, err := h.req(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := h.do(t, u)
			hd := resp.Header
			w := tc.want
			if resp.StatusCode != w.status {
				t.Errorf("status %d, want %d (%s)", resp.StatusCode, w.status, body)
			}
			check := func(name, got, want string) {
				if got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
			check("Access-Control-Allow-Origin", strings.Join(hd.Values("Access-Control-Allow-Origin"), ","), w.origin)
			creds := ""
			if w.credentials {
				creds = "true"
			}
			check("Access-Control-Allow-Credentials", hd.Get("Access-Control-Allow-Credentials"), creds)
			check("Access-Control-Allow-Methods", hd.Get("Access-Control-Allow-Methods"), w.methods)
			check("Access-Control-Allow-Headers", hd.Get("Access-Control-Allow-Headers"), w.headers)
			check("Access-Control-Max-Age", hd.Get("Access-Control-Max-Age"), w.maxAge)
			if got := strings.Contains(strings.Join(hd.Values("Vary"), ","), "Origin"); got != w.varyOrigin {
				t.Errorf("Vary %q: Origin in it %v, want %v", hd.Values("Vary"), got, w.varyOrigin)
			}
			if got := strings.Contains(hd.Get("Access-Control-Expose-Headers"), "X-Request-Id"); got != w.expose {
				t.Errorf("Access-Control-Expose-Headers %q: X-Request-Id in it %v, want %v", hd.Get("Access-Control-Expose-Headers"), got, w.expose)
			}
			if !strings.HasPrefix(body, w.body) {
				t.Errorf("body %q, want it to begin with %q", body, w.body)
			}
			if tc.req.Method == http.MethodOptions && authorized.Load() != 0 {
				t.Error("a preflight reached the Authorize hook")
			}
			if w.status == 204 {
				// Counted under its own route label, not as an unmatched path.
				testenv.WaitFor(t, 2*time.Second, func() error {
					if n := h.metric(t, "tokenbus_gateway_requests_total", map[string]string{"route": "preflight", "status": "204"}); n != 1 {
						return fmt.Errorf("preflights counted: %v", n)
					}
					return nil
				})
			}
		})
	}
}

// req makes a template request (a path, no host) one to this harness.
func (h *harness) req(r *http.Request) (*http.Request, error) {
	u, err := http.NewRequest(r.Method, h.base+r.URL.Path, r.Body)
	if err != nil {
		return nil, err
	}
	u.Header = r.Header.Clone()
	u.ContentLength = r.ContentLength
	return u, nil
}

// A config no browser could match fails the check at start.
func TestCORSCheck(t *testing.T) {
	for _, tc := range []struct {
		origins []string
		ok      bool
	}{
		{[]string{"*"}, true},
		{[]string{"https://app.example", "http://localhost:3000"}, true},
		{[]string{"https://app.example/"}, true},
		{nil, true},
		{[]string{"app.example"}, false},
		{[]string{"https://app.example/path"}, false},
		{[]string{"https://"}, false},
		{[]string{"https://u:p@app.example"}, false},
	} {
		if err := (CORSConfig{Origins: tc.origins}).Check(); (err == nil) != tc.ok {
			t.Errorf("Check(%q) = %v, want ok %v", tc.origins, err, tc.ok)
		}
	}
}

// BenchmarkCORS: what the middleware adds to a request (not per token: a
// stream's head is built once), against the same app without it.
func BenchmarkCORS(b *testing.B) {
	for _, bc := range []struct {
		name, origin, method string
		cfg                  CORSConfig
	}{
		{"off", "https://app.example", fiber.MethodPost, CORSConfig{}},
		{"any, no Origin", "", fiber.MethodPost, CORSConfig{Origins: []string{"*"}}},
		{"any, Origin", "https://app.example", fiber.MethodPost, CORSConfig{Origins: []string{"*"}}},
		{"listed, Origin", "https://app.example", fiber.MethodPost, CORSConfig{Origins: []string{"https://other.example", "https://app.example"}}},
		{"preflight", "https://app.example", fiber.MethodOptions, CORSConfig{Origins: []string{"*"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			app := fiber.New()
			if x := newCORS(bc.cfg); x != nil {
				app.Use(x.handle)
			}
			app.Post("/v1/chat/completions", func(c *fiber.Ctx) error { return c.SendString("ok") })
			h := app.Handler()
			var ctx fasthttp.RequestCtx
			b.ReportAllocs()
			for b.Loop() {
				ctx.Request.Reset()
				ctx.Response.Reset()
				ctx.Request.Header.SetMethod(bc.method)
				ctx.Request.SetRequestURI("/v1/chat/completions")
				if bc.origin != "" {
					ctx.Request.Header.Set("Origin", bc.origin)
				}
				if bc.method == fiber.MethodOptions {
					ctx.Request.Header.Set("Access-Control-Request-Method", "POST")
					ctx.Request.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
				}
				h(&ctx)
			}
		})
	}
}

// After a stream the connection is handed back to fasthttp for the next
// request (httpstream): a stream on the reused connection carries the
// header too.
func TestCORSStreamOnReusedConnection(t *testing.T) {
	h := newHarness(t, harnessOptions{cfg: Config{CORS: CORSConfig{Origins: []string{"https://app.example"}}}})
	for i := range 2 {
		var reused bool
		req, _ := http.NewRequest(http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(chatBody))
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
		}))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Origin", "https://app.example")
		resp, body := h.do(t, req)
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "https://app.example" || body != standardSSE(chatFrames) {
			t.Fatalf("stream %d: Allow-Origin %q, body %q", i, got, body)
		}
		if i == 1 && !reused {
			t.Fatal("the second stream did not reuse the connection: the test shows nothing")
		}
	}
}
