package httpengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// h1Server is an HTTP server that counts the connections it accepted.
func h1Server(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func h1For(t *testing.T, rawURL string) *h1Transport {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{}
	cfg.defaults()
	tr := newH1Transport(newTransport(&cfg), u, &cfg)
	if tr == nil {
		t.Fatalf("no h1 transport for %s", rawURL)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func h1Do(t *testing.T, c *http.Client, ctx context.Context, method, rawURL, body string) (*http.Response, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

func TestH1ReusesConnections(t *testing.T) {
	// Each answer shape must leave the connection ready for the next request.
	srv, conns := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/chunked":
			fmt.Fprintf(w, "got %s", b)
			w.(http.Flusher).Flush() // no Content-Length: chunked
			fmt.Fprint(w, " twice")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			fmt.Fprintf(w, "got %s", b)
		}
	})
	c := &http.Client{Transport: h1For(t, srv.URL)}
	cases := []struct{ method, path, body, want string }{
		{"POST", "/sized", "abc", "got abc"},
		{"POST", "/chunked", "xyz", "got xyz twice"},
		{"GET", "/empty", "", ""},
		{"POST", "/sized", "", "got "},
		{"GET", "/sized?q=1", "", "got "},
	}
	for round := range 3 {
		for _, tc := range cases {
			resp, err := h1Do(t, c, context.Background(), tc.method, srv.URL+tc.path, tc.body)
			if err != nil {
				t.Fatalf("round %d %s %s: %v", round, tc.method, tc.path, err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(got) != tc.want {
				t.Fatalf("round %d %s %s: %q, %v; want %q", round, tc.method, tc.path, got, err, tc.want)
			}
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 15 requests one after another, want 1", n)
	}
}

func TestH1ClosedEarlyIsNotReused(t *testing.T) {
	// A body closed before its end closes the connection at once (the
	// server sees the client go): closing must not wait for the rest.
	gone := make(chan struct{})
	srv, conns := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/short" {
			fmt.Fprint(w, "ok")
			return
		}
		fmt.Fprint(w, "first")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	c := &http.Client{Transport: h1For(t, srv.URL)}
	resp, err := h1Do(t, c, context.Background(), "POST", srv.URL+"/endless", "x")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first" {
		t.Fatalf("read %q, %v", buf, err)
	}
	start := time.Now()
	resp.Body.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the connection close")
	}
	resp, err = h1Do(t, c, context.Background(), "POST", srv.URL+"/short", "x")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the closed one is not reused)", n)
	}
}

func TestH1ServerClosedIdleConnection(t *testing.T) {
	// uvicorn closes a connection idle for 5 s. The next request must not
	// fail on it: the peek before reuse finds it closed.
	srv, conns := h1Server(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	c := &http.Client{Transport: h1For(t, srv.URL)}
	get := func() {
		t.Helper()
		resp, err := h1Do(t, c, context.Background(), "POST", srv.URL+"/", "x")
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
			t.Fatalf("body %q", b)
		}
		resp.Body.Close()
	}
	get()
	srv.CloseClientConnections() // the server drops the idle connection
	deadline := time.Now().Add(5 * time.Second)
	for conns.Load() == 1 && time.Now().Before(deadline) {
		get() // fails without the peek if it lands on the dropped connection
		if conns.Load() == 1 {
			time.Sleep(10 * time.Millisecond) // the close may not have reached us yet
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

func TestH1CancelEndsWait(t *testing.T) {
	// A request whose context ends while it waits for the answer returns
	// the context's cause, and the connection closes.
	release := make(chan struct{})
	srv, _ := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := &http.Client{Transport: h1For(t, srv.URL)}
	why := errors.New("stalled")
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(50*time.Millisecond, func() { cancel(why) })
	start := time.Now()
	_, err := h1Do(t, c, ctx, "POST", srv.URL+"/", "x")
	if !errors.Is(err, why) {
		t.Fatalf("err %v, want the cause %v", err, why)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned after %v", d)
	}
}

func TestH1CancelDuringBody(t *testing.T) {
	srv, _ := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	c := &http.Client{Transport: h1For(t, srv.URL)}
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := h1Do(t, c, ctx, "POST", srv.URL+"/", "x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = io.ReadAll(resp.Body)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("read error %v, want context.Canceled", err)
	}
}

func TestH1Headers(t *testing.T) {
	// Headers go out as net/http sends them: a CR or LF in a value becomes a
	// space, so a value cannot add a header line.
	got := make(chan http.Header, 1)
	srv, _ := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		h.Set("X-Body", string(b))
		h.Set("X-Length", fmt.Sprint(r.ContentLength))
		h.Set("X-Host", r.Host)
		got <- h
	})
	c := &http.Client{Transport: h1For(t, srv.URL)}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"a":1}`))
	req.Header.Set("X-Request-Id", "abc\r\nX-Evil: 1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := <-got
	if h.Get("X-Evil") != "" || h.Get("X-Request-Id") != "abc  X-Evil: 1" {
		t.Fatalf("X-Request-Id %q, X-Evil %q", h.Get("X-Request-Id"), h.Get("X-Evil"))
	}
	if h.Get("X-Body") != `{"a":1}` || h.Get("X-Length") != "7" {
		t.Fatalf("body %q, length %s", h.Get("X-Body"), h.Get("X-Length"))
	}
	if want := strings.TrimPrefix(srv.URL, "http://"); h.Get("X-Host") != want {
		t.Fatalf("Host %q, want %q", h.Get("X-Host"), want)
	}
	// A body of unknown length gets its length counted.
	req, _ = http.NewRequest("POST", srv.URL+"/v1/completions", io.MultiReader(strings.NewReader(`{"b":`), strings.NewReader(`22}`)))
	if req.ContentLength != 0 {
		t.Fatalf("the test needs a body of unknown length, has %d", req.ContentLength)
	}
	if resp, err = c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h = <-got; h.Get("X-Body") != `{"b":22}` || h.Get("X-Length") != "8" {
		t.Fatalf("body %q, length %s", h.Get("X-Body"), h.Get("X-Length"))
	}
}

func TestH1CloseIdleConnections(t *testing.T) {
	closed := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	tr := h1For(t, srv.URL)
	resp, err := h1Do(t, &http.Client{Transport: tr}, context.Background(), "GET", srv.URL+"/", "")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	tr.CloseIdleConnections()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the pooled connection was not closed")
	}
}

func TestH1OnlyForPlainHTTP(t *testing.T) {
	cfg := Config{}
	cfg.defaults()
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"http://127.0.0.1:8000", true},
		{"https://127.0.0.1:8000", false},
		{"http://engine.example:8000", false}, // through the proxy: std's job
	} {
		u, _ := url.Parse(tc.url)
		std := newTransport(&cfg)
		// As ProxyFromEnvironment with HTTP_PROXY set and NO_PROXY=127.0.0.1
		// (which reads the environment once per process).
		std.Proxy = func(r *http.Request) (*url.URL, error) {
			if r.URL.Hostname() == "127.0.0.1" {
				return nil, nil
			}
			return url.Parse("http://proxy.invalid:3128")
		}
		if got := newH1Transport(std, u, &cfg) != nil; got != tc.want {
			t.Errorf("%s: h1 %v, want %v", tc.url, got, tc.want)
		}
	}
}

// A chunked body's end that came with its last chunk is seen with the last
// event: endBuffered says so (the stream's end is then read inline), reading
// on takes nothing more from the socket, and the connection is back in the
// pool. An end still on its way is not seen.
func TestH1EndBuffered(t *testing.T) {
	const event = "data: [DONE]\n\n"
	for _, tc := range []struct {
		name     string
		together bool
	}{{"end with the last chunk", true}, {"end later", false}} {
		t.Run(tc.name, func(t *testing.T) {
			later := make(chan struct{})
			srv, _ := h1Server(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				conn, bw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
					fmt.Sprintf("%x\r\n%s\r\n", len(event), event)
				if tc.together {
					head += "0\r\n\r\n"
				}
				_, _ = bw.WriteString(head)
				_ = bw.Flush()
				<-later
				if !tc.together {
					_, _ = bw.WriteString("0\r\n\r\n")
					_ = bw.Flush()
				}
				_, _ = io.Copy(io.Discard, conn) // until the client closes it
			})
			tr := h1For(t, srv.URL)
			resp, err := h1Do(t, &http.Client{Transport: tr}, context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions", `{}`)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			buf := make([]byte, len(event))
			if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != event {
				t.Fatalf("read %q, %v", buf, err)
			}
			b := resp.Body.(*h1Body)
			if got := b.endBuffered(); got != tc.together {
				t.Fatalf("endBuffered = %v", got)
			}
			if tc.together {
				if n, err := io.Copy(io.Discard, resp.Body); n != 0 || err != nil {
					t.Fatalf("after the last event: %d bytes, %v", n, err)
				}
				tr.mu.Lock()
				idle := len(tr.idle)
				tr.mu.Unlock()
				if idle != 1 {
					t.Fatalf("%d idle connections after the body's end, want 1", idle)
				}
			}
			close(later)
		})
	}
}
