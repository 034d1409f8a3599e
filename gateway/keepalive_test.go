package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// Streams, unary requests and errors follow one another on one keep-alive
// connection, as an OpenAI client's connection pool uses it.
func TestStreamKeepAlive(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var conns []string
	var reused []bool
	trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		conns = append(conns, ci.Conn.LocalAddr().String())
		reused = append(reused, ci.Reused)
	}}
	for i, tc := range []struct {
		body, want string
		status     int
	}{
		{chatBody, standardSSE(chatFrames), 200},
		{chatBody, standardSSE(chatFrames), 200},
		{unaryBody, chatFull, 200},
		{`{"model":"nope","messages":[{"role":"user","content":"hi"}],"stream":true}`, "", 404},
		{chatBody, standardSSE(chatFrames), 200},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		resp, body := h.do(t, req)
		if resp.StatusCode != tc.status || tc.want != "" && body != tc.want {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if tc.status == 200 && strings.Contains(tc.body, `"stream":true`) {
			if resp.Close || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
				t.Fatalf("request %d: stream not chunked keep-alive: close=%v te=%v", i, resp.Close, resp.TransferEncoding)
			}
		}
	}
	for i := 1; i < len(conns); i++ {
		if !reused[i] || conns[i] != conns[0] {
			t.Fatalf("request %d used a new connection (%v, reused %v)", i, conns, reused)
		}
	}
}

// rawExchange writes reqs on one TCP connection at once (pipelined) and
// reads a response for each.
func rawExchange(t *testing.T, addr string, reqs ...string) []*http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, strings.Join(reqs, "")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	var out []*http.Response
	for i := range reqs {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("response %d body: %v", i, err)
		}
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
	return out
}

func rawPost(body, extra string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// Requests pipelined behind a stream (read by fasthttp before the stream
// started) are served in order after it, not lost.
func TestStreamPipelined(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	addr := strings.TrimPrefix(h.base, "http://")
	resps := rawExchange(t, addr, rawPost(chatBody, ""), rawPost(unaryBody, ""), rawPost(chatBody, ""))
	wants := []string{standardSSE(chatFrames), chatFull, standardSSE(chatFrames)}
	for i, resp := range resps {
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != wants[i] {
			t.Fatalf("response %d: %d %q", i, resp.StatusCode, b)
		}
	}
}

// A client that asks to close, or speaks HTTP/1.0, gets a stream that ends
// with the connection, as before keep-alive.
func TestStreamConnectionClose(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	addr := strings.TrimPrefix(h.base, "http://")
	for _, req := range []string{
		rawPost(chatBody, "Connection: close\r\n"),
		strings.Replace(rawPost(chatBody, ""), "HTTP/1.1", "HTTP/1.0", 1),
	} {
		resps := rawExchange(t, addr, req)
		b, _ := io.ReadAll(resps[0].Body)
		if resps[0].StatusCode != 200 || string(b) != standardSSE(chatFrames) || !resps[0].Close {
			t.Fatalf("%.60q: %d close=%v %q", req, resps[0].StatusCode, resps[0].Close, b)
		}
	}
}

// Shutdown closes a connection handed back after a stream and idle since:
// it does not wait for the connection's read timeout.
func TestShutdownClosesResumedConn(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	addr := strings.TrimPrefix(h.base, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, rawPost(chatBody, "")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != standardSSE(chatFrames) || resp.Close {
		t.Fatalf("stream: close=%v %q %v", resp.Close, b, err)
	}
	testenv.WaitFor(t, 2*time.Second, func() error { // handed back
		if n := h.gw.streams.IdleConns(); n != 1 {
			return fmt.Errorf("%d connections handed back, want 1", n)
		}
		return nil
	})
	start := time.Now()
	if err := h.shutdown(5 * time.Second); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("shutdown took %s with an idle resumed connection", d)
	}
	if n, err := r.Read(make([]byte, 1)); err == nil {
		t.Fatalf("connection still open after shutdown (read %d bytes)", n)
	}
}

// A client that stops reading mid-stream is cut after StuckTimeout: its
// worker is told to cancel, and the writer does not hang on until the
// request's deadline.
func TestStuckClientCut(t *testing.T) {
	big := `{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("a", 60<<10) + `"}}]}`
	stop := make(chan struct{})
	var sending sync.WaitGroup
	h := newHarness(t, harnessOptions{cfg: Config{StuckTimeout: 300 * time.Millisecond, ProbeInterval: 50 * time.Millisecond},
		worker: func(h *harness, m *nats.Msg) {
			h.accept(m)
			sending.Add(1)
			go func() { // far more than the socket buffers hold
				defer sending.Done()
				for i := uint64(2); i < 1000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					h.reply(m, schemas.FrameChunk, i, big)
				}
			}()
		}})
	// The sender stops before the harness closes its connection (a publish
	// on a closed one failed the test once, after its end).
	defer func() { close(stop); sending.Wait() }()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, rawPost(chatBody, "")); err != nil {
		t.Fatal(err)
	}
	h.nextRequest(t)
	// Read nothing. The gateway must give up and cancel at the worker.
	select {
	case m := <-h.cancels:
		if len(m.Data) == 0 {
			t.Fatal("empty cancel")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no cancel for a client that reads nothing")
	}
	testenv.WaitFor(t, 5*time.Second, h.metricIs(t, "tokenbus_gateway_active_streams", 0))
}
