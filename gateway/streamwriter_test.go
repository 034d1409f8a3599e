package gateway

import (
	"bufio"
	"bytes"
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
}

func (c *bufConn) Write(p []byte) (int, error) { return c.Buffer.Write(p) }

// discardConn drops every write.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

// failConn fails every write.
type failConn struct{ net.Conn }

func (failConn) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// In chunked mode the bytes are a valid chunked body (checked by net/http's
// decoder) whose content is exactly what was written, with one chunk per
// flush; in plain mode they are the content itself.
func TestStreamWriterFraming(t *testing.T) {
	bursts := [][]string{
		{"data: a\n\n"},
		{"data: b\n\n", "data: c\n\n"},
		{strings.Repeat("x", streamBufSize+100)}, // over the buffer: flushed on write
		{},                                       // an empty flush writes nothing
		{"data: [DONE]\n\n"},
	}
	for _, chunked := range []bool{false, true} {
		var out bytes.Buffer
		w := newStreamWriter(&bufConn{Buffer: &out}, chunked)
		w.WriteHead([]byte("HEAD\r\n"))
		var want strings.Builder
		for i, b := range bursts {
			for _, s := range b {
				_, _ = w.Write([]byte(s))
				want.WriteString(s)
			}
			var err error
			if i == len(bursts)-1 {
				err = w.End()
			} else {
				err = w.Flush()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		w.release()
		got := out.String()
		if !strings.HasPrefix(got, "HEAD\r\n") {
			t.Fatalf("chunked=%v: head not first: %.20q", chunked, got)
		}
		body := got[len("HEAD\r\n"):]
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

func TestStreamWriterStickyError(t *testing.T) {
	w := newStreamWriter(failConn{}, true)
	_, _ = w.Write([]byte("data: a\n\n"))
	if err := w.Flush(); err == nil {
		t.Fatal("flush to a failing conn succeeded")
	}
	if _, err := w.Write([]byte("more")); err == nil {
		t.Fatal("write after a failed flush succeeded")
	}
	if err := w.End(); err == nil {
		t.Fatal("end after a failed flush succeeded")
	}
}

// The response the gateway writes for a keep-alive stream parses as HTTP/1.1
// with a chunked body, and the next response on the connection starts right
// after it.
func TestStreamResponseParses(t *testing.T) {
	var out bytes.Buffer
	w := newStreamWriter(&bufConn{Buffer: &out}, true)
	w.WriteHead([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
	_, _ = w.Write([]byte("data: {}\n\n"))
	_ = w.Flush()
	_, _ = w.Write([]byte("data: [DONE]\n\n"))
	_ = w.End()
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
