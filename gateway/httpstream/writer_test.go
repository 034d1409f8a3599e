package httpstream

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"testing"
)

// bufConn is a net.Conn whose writes go to a buffer (nil methods panic).
type bufConn struct {
	net.Conn
	Buffer *bytes.Buffer
	writes int
}

func (c *bufConn) Write(p []byte) (int, error) {
	c.writes++
	return c.Buffer.Write(p)
}

// discardConn drops every write.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

// failConn fails every write.
type failConn struct{ net.Conn }

func (failConn) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// testStream is a stream on conn as the function given to Run sees it, with
// head as its response head.
func testStream(conn net.Conn, chunked bool, head string) *Stream {
	st := newStream(nil, conn, chunked)
	st.buf = append(st.buf, head...)
	st.startBody()
	st.live, st.running, st.ctx = true, true, context.Background()
	return st
}

// In chunked mode the bytes are a valid chunked body (checked by net/http's
// decoder) whose content is exactly what was written, with one chunk per
// flush; in plain mode they are the content itself. The head goes first, in
// the same write as the first burst. Between bursts the stream holds no
// buffer.
func TestWriterFraming(t *testing.T) {
	bursts := [][]string{
		{"data: a\n\n"},
		{"data: b\n\n", "data: c\n\n"},
		{strings.Repeat("x", burstSize+100)}, // over the buffer: flushed on write
		{},                                   // an empty flush writes nothing
		{"data: [DONE]\n\n"},
	}
	for _, chunked := range []bool{false, true} {
		for _, head := range []string{"HEAD\r\n", strings.Repeat("h", 3<<10) + "\r\n"} { // the second over the pooled buffer's spare room
			var out bytes.Buffer
			conn := &bufConn{Buffer: &out}
			w := testStream(conn, chunked, head)
			var want strings.Builder
			for i, b := range bursts {
				for _, s := range b {
					if err := w.add([]byte(s)); err != nil {
						t.Fatal(err)
					}
					want.WriteString(s)
				}
				var err error
				if i == len(bursts)-1 {
					err = w.end()
				} else {
					err = w.Flush()
				}
				if err != nil {
					t.Fatal(err)
				}
				if i < len(bursts)-1 && len(b) > 0 && w.pooled != nil {
					t.Fatalf("chunked=%v: the stream holds its buffer between bursts", chunked)
				}
			}
			w.release()
			if conn.writes != 4 {
				t.Errorf("chunked=%v: %d writes, want 4 (one per non-empty flush)", chunked, conn.writes)
			}
			got := out.String()
			if !strings.HasPrefix(got, head) {
				t.Fatalf("chunked=%v: head not first: %.20q", chunked, got)
			}
			body := got[len(head):]
			if chunked {
				if !strings.HasSuffix(body, "0\r\n\r\n") {
					t.Fatalf("no last chunk: ...%q", body[max(0, len(body)-20):])
				}
				if n := strings.Count(body, "\r\n"); n != 2*4+2 { // 4 non-empty chunks, then the last
					t.Errorf("%d CRLFs, want 10 (one chunk per non-empty flush)", n)
				}
				dec, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(strings.NewReader(body))))
				if err != nil {
					t.Fatal(err)
				}
				body = string(dec)
			}
			if body != want.String() {
				t.Fatalf("chunked=%v: content differs (%d bytes, want %d)", chunked, len(body), want.Len())
			}
		}
	}
}

// A head alone (a stream whose body is only its end) goes out with the last
// chunk.
func TestWriterHeadWithEnd(t *testing.T) {
	var out bytes.Buffer
	w := testStream(&bufConn{Buffer: &out}, true, "HEAD\r\n\r\n")
	if err := w.end(); err != nil {
		t.Fatal(err)
	}
	if out.String() != "HEAD\r\n\r\n0\r\n\r\n" {
		t.Fatalf("%q", out.String())
	}
}

func TestWriterStickyError(t *testing.T) {
	w := testStream(failConn{}, true, "")
	_ = w.add([]byte("data: a\n\n"))
	if err := w.Flush(); err == nil {
		t.Fatal("flush to a failing conn succeeded")
	}
	if _, err := w.WriteEvents([]byte("{}")); err == nil {
		t.Fatal("write after a failed flush succeeded")
	}
	if err := w.Done(); err == nil || w.Err() == nil {
		t.Fatal("Done after a failed flush succeeded")
	}
	if w.state.Load() != stateOpen {
		t.Fatal("a failed stream counts as ended")
	}
}

// The response of a keep-alive stream parses as HTTP/1.1 with a chunked
// body, and the next response on the connection starts right after it.
func TestStreamResponseParses(t *testing.T) {
	var out bytes.Buffer
	w := testStream(&bufConn{Buffer: &out}, true, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	_, _ = w.WriteEvents([]byte("{}"))
	_ = w.Flush()
	_ = w.Done()
	out.WriteString("HTTP/1.1 204 No Content\r\n\r\n")
	r := bufio.NewReader(&out)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "data: {}\n\ndata: [DONE]\n\n" {
		t.Fatalf("body %q, %v", b, err)
	}
	next, err := http.ReadResponse(r, nil)
	if err != nil || next.StatusCode != 204 {
		t.Fatalf("next response: %v %v", next, err)
	}
}
