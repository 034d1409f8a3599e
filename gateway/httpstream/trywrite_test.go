//go:build unix

package httpstream

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TryFlush writes what the socket takes without waiting; when a client reads
// nothing and the socket fills, it keeps the rest, Ready turns false, and the
// next Flush sends the rest before anything newer: the client gets every
// event whole and in order, and the connection serves its next request.
func TestTryFlushKeepsOrder(t *testing.T) {
	payload := strings.Repeat("x", 8<<10)
	var want strings.Builder
	result := make(chan string, 1)
	reading := make(chan struct{})
	ts := startServer(t, serverOptions{stream: func(s *Server, rc *fasthttp.RequestCtx) {
		if tc, ok := rc.Conn().(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(4 << 10)
		}
		st := s.Begin(rc, nil)
		_, _ = st.WriteEvents([]byte(`{"i":0}`))
		_ = st.Flush()
		st.Run(context.Background(), func(st *Stream) {
			fmt.Fprintf(&want, "data: {\"i\":0}\n\n")
			full := false
			for i := 1; i < 10000 && !full; i++ {
				if !st.Ready() {
					result <- fmt.Sprintf("not ready before event %d", i)
					return
				}
				ev := fmt.Sprintf(`{"i":%d,"p":"%s"}`, i, payload)
				_, _ = st.WriteEvents([]byte(ev))
				fmt.Fprintf(&want, "data: %s\n\n", ev)
				full = !st.TryFlush()
			}
			switch {
			case !full:
				result <- "the socket never filled"
				return
			case st.Ready():
				result <- "ready with bytes unsent"
				return
			}
			close(reading) // the client reads from now on
			_, _ = st.WriteEvents([]byte(`{"i":"last"}`))
			fmt.Fprintf(&want, "data: {\"i\":\"last\"}\n\n")
			if err := st.Flush(); err != nil {
				result <- "flush: " + err.Error()
				return
			}
			_ = st.Done()
			want.WriteString("data: [DONE]\n\n")
			result <- ""
		})
	}})
	conn, r := dial(t, ts)
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	send(t, conn, get("/stream", ""))
	select {
	case <-reading:
	case msg := <-result:
		t.Fatal(msg)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not fill the socket")
	}
	resp, body := readResponse(t, r)
	if msg := <-result; msg != "" {
		t.Fatal(msg)
	}
	if resp.StatusCode != 200 || body != want.String() {
		t.Fatalf("status %d, body of %d bytes, want %d bytes (first difference at %d)", resp.StatusCode, len(body),
			want.Len(), firstDiff(body, want.String()))
	}
	send(t, conn, get("/plain", ""))
	resp, body = readResponse(t, r)
	checkPlain(t, resp, body)
}

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
