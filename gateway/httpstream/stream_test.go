package httpstream

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// testServer is a fasthttp server streaming with the package: /stream runs
// its stream handler, every other path answers a plain "ok".
type testServer struct {
	*Server
	addr string
	// errs counts the errors fasthttp hands its ErrorHandler (and would
	// answer and log): a closed idle connection must not be one.
	errs *atomic.Int32
}

type serverOptions struct {
	cfg    Config
	stream func(s *Server, rc *fasthttp.RequestCtx) // default: defaultStream
}

func startServer(t *testing.T, o serverOptions) *testServer {
	t.Helper()
	if o.stream == nil {
		o.stream = defaultStream
	}
	errs := new(atomic.Int32)
	srv := &fasthttp.Server{ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second,
		ErrorHandler: func(rc *fasthttp.RequestCtx, err error) {
			errs.Add(1)
			rc.Error(err.Error(), fasthttp.StatusBadRequest)
		}}
	s := New(srv, o.cfg)
	srv.Handler = func(rc *fasthttp.RequestCtx) {
		if string(rc.Path()) == "/stream" {
			o.stream(s, rc)
			return
		}
		rc.SetContentType("text/plain")
		rc.SetBodyString("ok")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		s.Drain()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.ShutdownWithContext(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &testServer{Server: s, addr: ln.Addr().String(), errs: errs}
}

// defaultStream sends streamBody: its first event from the handler, two more
// in one burst from Run, then [DONE]. It sets headers of its own, one of
// which (Content-Type) the stream replaces.
func defaultStream(s *Server, rc *fasthttp.RequestCtx) {
	rc.Response.Header.Set("X-Request-Id", "r1")
	rc.Response.Header.SetContentType("text/plain")
	st := s.Begin(rc, nil)
	_, _ = st.WriteEvents([]byte(`{"i":0}`))
	_ = st.Flush()
	st.Run(context.Background(), func(st *Stream) {
		_, _ = st.WriteEvents([]byte("{\"i\":1}\n{\"i\":2}"))
		_ = st.Flush()
		_ = st.Done()
	})
}

const streamBody = "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: [DONE]\n\n"

// get is a raw GET request; extra is more header lines.
func get(path, extra string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n"
}

// dial opens a connection to ts that the test's end closes.
func dial(t *testing.T, ts *testServer) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn, bufio.NewReader(conn)
}

func send(t *testing.T, conn net.Conn, reqs ...string) {
	t.Helper()
	if _, err := io.WriteString(conn, strings.Join(reqs, "")); err != nil {
		t.Fatal(err)
	}
}

// readResponse reads one response and its whole body.
func readResponse(t *testing.T, r *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	return resp, string(b)
}

// checkStream fails unless resp is the default stream, chunked on a kept
// connection or not chunked on a closing one.
func checkStream(t *testing.T, resp *http.Response, body string, keep bool) {
	t.Helper()
	chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"
	if resp.StatusCode != 200 || body != streamBody || resp.Close == keep || chunked != keep {
		t.Fatalf("stream: %d close=%v te=%v %q", resp.StatusCode, resp.Close, resp.TransferEncoding, body)
	}
}

func checkPlain(t *testing.T, resp *http.Response, body string) {
	t.Helper()
	if resp.StatusCode != 200 || body != "ok" || resp.Close {
		t.Fatalf("plain: %d close=%v %q", resp.StatusCode, resp.Close, body)
	}
}

// expectClosed fails unless the server closes conn (with nothing more sent).
func expectClosed(t *testing.T, r *bufio.Reader) {
	t.Helper()
	if n, err := r.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection not closed: read %d, %v", n, err)
	}
}

// The stream's head carries the headers set before Begin, except those the
// stream sets itself.
func TestStreamHead(t *testing.T) {
	ts := startServer(t, serverOptions{})
	conn, r := dial(t, ts)
	send(t, conn, get("/stream", ""))
	resp, body := readResponse(t, r)
	checkStream(t, resp, body, true)
	for k, want := range map[string]string{
		"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Request-Id": "r1",
	} {
		if got := resp.Header.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
}

// After a stream the connection serves the client's next requests, streams
// and others, one after another, as an OpenAI client's pool uses it.
func TestStreamKeepAlive(t *testing.T) {
	ts := startServer(t, serverOptions{})
	conn, r := dial(t, ts)
	for i, path := range []string{"/stream", "/stream", "/plain", "/stream", "/plain"} {
		send(t, conn, get(path, ""))
		resp, body := readResponse(t, r)
		if path == "/stream" {
			checkStream(t, resp, body, true)
		} else {
			checkPlain(t, resp, body)
		}
		if t.Failed() {
			t.Fatalf("request %d", i)
		}
	}
}

// Requests a client pipelines behind a stream (read by fasthttp before the
// stream started, or sent while it ran) are served in order after it, and a
// stream behind a plain response that fasthttp still holds comes after that
// response.
func TestStreamPipelined(t *testing.T) {
	ts := startServer(t, serverOptions{})
	conn, r := dial(t, ts)
	paths := []string{"/stream", "/plain", "/stream", "/plain", "/plain", "/stream", "/stream"}
	var reqs []string
	for _, p := range paths {
		reqs = append(reqs, get(p, ""))
	}
	send(t, conn, reqs...)
	for i, path := range paths {
		resp, body := readResponse(t, r)
		if path == "/stream" {
			checkStream(t, resp, body, true)
		} else {
			checkPlain(t, resp, body)
		}
		if t.Failed() {
			t.Fatalf("response %d", i)
		}
	}
	// And the connection still serves.
	send(t, conn, get("/plain", ""))
	resp, body := readResponse(t, r)
	checkPlain(t, resp, body)
}

// A client that asks to close, or speaks HTTP/1.0, gets a stream that is not
// chunked and ends with the connection.
func TestStreamEndsWithConnection(t *testing.T) {
	ts := startServer(t, serverOptions{})
	for _, req := range []string{
		get("/stream", "Connection: close\r\n"),
		strings.Replace(get("/stream", ""), "HTTP/1.1", "HTTP/1.0", 1),
	} {
		conn, r := dial(t, ts)
		send(t, conn, req)
		resp, body := readResponse(t, r)
		checkStream(t, resp, body, false)
		expectClosed(t, r)
		if n := ts.IdleConns(); n != 0 {
			t.Fatalf("%d connections handed back", n)
		}
	}
}

// Drain closes a connection handed back after a stream and idle since (it
// does not wait for its read timeout), and later streams end with their
// connection.
func TestDrainClosesHandedBack(t *testing.T) {
	ts := startServer(t, serverOptions{})
	conn, r := dial(t, ts)
	send(t, conn, get("/stream", ""))
	resp, body := readResponse(t, r)
	checkStream(t, resp, body, true)
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := ts.IdleConns(); n != 1 {
			return fmt.Errorf("%d connections handed back", n)
		}
		return nil
	})
	ts.Drain()
	if n := ts.IdleConns(); n != 0 {
		t.Fatalf("%d connections still tracked after Drain", n)
	}
	expectClosed(t, r)
	// fasthttp saw a client going away, not an error to answer (the gateway
	// logged and counted each such connection as a 500 at shutdown).
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := ts.IdleConns(); n != 0 {
			return fmt.Errorf("%d tracked", n)
		}
		return nil
	})
	if n := ts.errs.Load(); n != 0 {
		t.Fatalf("closing an idle handed-back connection reached the error handler %d times", n)
	}

	conn, r = dial(t, ts)
	send(t, conn, get("/stream", ""))
	resp, body = readResponse(t, r)
	checkStream(t, resp, body, false)
	expectClosed(t, r)
}

// On a connection's first request the first burst leaves from the handler,
// before it returns (no wait for the hijack goroutine to be scheduled).
func TestFirstBurstFromHandler(t *testing.T) {
	firstRead := make(chan struct{})
	var early atomic.Bool
	ts := startServer(t, serverOptions{stream: func(s *Server, rc *fasthttp.RequestCtx) {
		st := s.Begin(rc, nil)
		_, _ = st.WriteEvents([]byte(`{"i":0}`))
		_ = st.Flush()
		select { // the client reads the event while the handler still runs
		case <-firstRead:
			early.Store(true)
		case <-time.After(5 * time.Second):
		}
		st.Run(context.Background(), func(st *Stream) { _ = st.Done() })
	}})
	conn, r := dial(t, ts)
	send(t, conn, get("/stream", ""))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: {\"i\":0}\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(firstRead)
	_, _ = io.Copy(io.Discard, resp.Body)
	if !early.Load() {
		t.Fatal("the first burst waited for the handler to return")
	}
}

// A stream whose context ended before its body did is written to its end
// but its connection is not reused.
func TestCutStreamNotReused(t *testing.T) {
	ts := startServer(t, serverOptions{stream: func(s *Server, rc *fasthttp.RequestCtx) {
		ctx, cancel := context.WithCancel(context.Background())
		st := s.Begin(rc, nil)
		st.Run(ctx, func(st *Stream) {
			cancel() // a shutdown cut or the request's deadline
			_, _ = st.WriteEvents([]byte("{\"i\":0}\n{\"i\":1}\n{\"i\":2}"))
			_ = st.Done()
		})
	}})
	conn, r := dial(t, ts)
	send(t, conn, get("/stream", ""), get("/plain", ""))
	resp, body := readResponse(t, r)
	if resp.StatusCode != 200 || body != streamBody {
		t.Fatalf("cut stream: %d %q", resp.StatusCode, body)
	}
	expectClosed(t, r)
}

// A client that hangs up mid-stream fails the writer's writes (sticky), and
// its connection is closed.
func TestClientGoneMidStream(t *testing.T) {
	ended := make(chan error, 1)
	ts := startServer(t, serverOptions{stream: func(s *Server, rc *fasthttp.RequestCtx) {
		st := s.Begin(rc, nil)
		st.Run(context.Background(), func(st *Stream) {
			for st.Err() == nil {
				_, _ = st.WriteEvents([]byte(`{"i":0}`))
				_ = st.Flush()
			}
			ended <- st.Done()
		})
	}})
	conn, r := dial(t, ts)
	send(t, conn, get("/stream", ""))
	if _, err := http.ReadResponse(r, nil); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("Done succeeded after the client left")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer did not notice the client left")
	}
}

// A client that stops reading mid-stream, while frames wait for the writer,
// is cut after StuckTimeout (not before): the request's context is cancelled,
// the blocked write fails within a second, and the writer returns.
func TestStuckClientCut(t *testing.T) {
	const stuck = 300 * time.Millisecond
	big := []byte(`{"content":"` + strings.Repeat("a", 64<<10) + `"}`)
	type result struct {
		lastTouch, cutAt, endAt time.Time
		cause                   error
	}
	done := make(chan result, 1)
	ts := startServer(t, serverOptions{cfg: Config{ProbeInterval: 20 * time.Millisecond, StuckTimeout: stuck},
		stream: func(s *Server, rc *fasthttp.RequestCtx) {
			ctx, cancel := context.WithCancelCause(context.Background())
			w := s.Watch(rc, func() bool { return true }, cancel, errTestGone)
			var cutAt atomic.Int64
			context.AfterFunc(ctx, func() { cutAt.Store(time.Now().UnixNano()) })
			st := s.Begin(rc, w)
			st.Run(ctx, func(st *Stream) {
				var last time.Time
				for st.Err() == nil { // far more than the socket buffers hold
					last = time.Now()
					w.Touch(last)
					_, _ = st.WriteEvents(big)
					_ = st.Flush()
				}
				done <- result{lastTouch: last, cutAt: time.Unix(0, cutAt.Load()), endAt: time.Now(), cause: context.Cause(ctx)}
			})
		}})
	conn, _ := dial(t, ts)
	send(t, conn, get("/stream", "")) // and read nothing
	var res result
	select {
	case res = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the writer is still blocked on a client that reads nothing")
	}
	if res.cause != errTestGone {
		t.Fatalf("cause %v", res.cause)
	}
	if d := res.cutAt.Sub(res.lastTouch); d < stuck {
		t.Errorf("cut %s after the last frame, StuckTimeout %s", d, stuck)
	}
	if d := res.endAt.Sub(res.cutAt); d > cutGrace+time.Second {
		t.Errorf("writer ended %s after the cut", d)
	}
}

// A request arriving on a handed-back connection takes it off Drain's list:
// fasthttp has it in hand, and Drain must not cut the request.
func TestNextRequestKeepsConnFromDrain(t *testing.T) {
	ts := startServer(t, serverOptions{})
	conn, r := dial(t, ts)
	send(t, conn, get("/stream", ""))
	resp, body := readResponse(t, r)
	checkStream(t, resp, body, true)
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := ts.IdleConns(); n != 1 {
			return fmt.Errorf("%d connections handed back", n)
		}
		return nil
	})
	send(t, conn, get("/plain", ""))
	resp, body = readResponse(t, r)
	checkPlain(t, resp, body)
	if n := ts.IdleConns(); n != 0 {
		t.Fatalf("%d connections still on Drain's list after a request on them", n)
	}
	ts.Drain()
	send(t, conn, get("/plain", ""))
	resp, body = readResponse(t, r)
	checkPlain(t, resp, body)
}
