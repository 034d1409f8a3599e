package httpengine

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// h1Transport is the HTTP/1.1 client for an engine on plain http with no
// proxy (the usual case: vLLM on the same host or network). It does each
// request's work in the caller's goroutine: the request is written in one
// write and the response read by net/http's own parser (http.ReadResponse)
// on the calling goroutine. net/http's Transport hands every request to two
// goroutines of the connection (a writer and a reader) and back: four
// hand-offs that were about a tenth of the worker's CPU per request on a
// fast engine. Anything else (https, a proxy, another host) goes to std.
type h1Transport struct {
	std         *http.Transport
	host        string // the engine's host, as in its URL (the Host header)
	addr        string // host:port to dial
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle     int
	idleTimeout time.Duration
	readBuf     int

	mu     sync.Mutex
	idle   []*h1Conn // most recently used last
	closed bool      // CloseIdleConnections ran: nothing is pooled any more
}

// h1Conn is a connection with its read buffer.
type h1Conn struct {
	c         net.Conn
	br        *bufio.Reader
	idleSince time.Time
}

// newH1Transport returns a transport for engine URL u, or nil when u needs
// std's features (TLS, a proxy).
func newH1Transport(std *http.Transport, u *url.URL, cfg *Config) *h1Transport {
	if u.Scheme != "http" {
		return nil
	}
	if p, err := std.Proxy(&http.Request{URL: u}); err != nil || p != nil {
		return nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	d := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &h1Transport{std: std, host: u.Host, addr: addr, dial: d.DialContext, maxIdle: cfg.MaxIdleConnsPerHost,
		idleTimeout: std.IdleConnTimeout, readBuf: std.ReadBufferSize}
}

var requestBufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.URL.Host != t.host {
		return t.std.RoundTrip(req)
	}
	ctx := req.Context()
	buf := requestBufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 1<<20 { // a huge body's buffer is left to the collector
			requestBufPool.Put(buf)
		}
	}()
	if err := writeRequest(buf, req, t.host); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := t.get(ctx)
	if err != nil {
		return nil, err
	}
	// Cancelling the request closes its connection: a write or read in
	// progress fails at once.
	stop := context.AfterFunc(ctx, func() { c.c.Close() })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.c.Close()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	if _, err := c.c.Write(buf.Bytes()); err != nil {
		return fail(err)
	}
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			return fail(err)
		}
		// 1xx answers (103 Early Hints) come before the real one.
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	b := &h1Body{t: t, c: c, stop: stop, ctx: ctx, body: resp.Body, reuse: !resp.Close && !req.Close}
	if resp.Body == http.NoBody {
		b.release(true)
		return resp, nil
	}
	resp.Body = b
	return resp, nil
}

// writeRequest puts req on the wire in buf: request line, headers, body.
func writeRequest(buf *bytes.Buffer, req *http.Request, host string) error {
	buf.WriteString(req.Method)
	buf.WriteByte(' ')
	buf.WriteString(req.URL.RequestURI())
	buf.WriteString(" HTTP/1.1\r\nHost: ")
	buf.WriteString(host)
	buf.WriteString("\r\nUser-Agent: tokenbus\r\n")
	// Header.Write drops invalid names and turns CR and LF in values into
	// spaces, as net/http's own transport does.
	if err := req.Header.Write(buf); err != nil {
		return err
	}
	if req.Close {
		buf.WriteString("Connection: close\r\n")
	}
	if req.Body == nil || req.Body == http.NoBody {
		if req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch {
			buf.WriteString("Content-Length: 0\r\n")
		}
		buf.WriteString("\r\n")
		return nil
	}
	if req.ContentLength > 0 { // known (NewRequest with a bytes.Reader): no copy to move
		buf.WriteString("Content-Length: ")
		buf.WriteString(strconv.FormatInt(req.ContentLength, 10))
		buf.WriteString("\r\n\r\n")
		n, err := buf.ReadFrom(req.Body)
		req.Body.Close()
		if err == nil && n != req.ContentLength {
			err = fmt.Errorf("http: ContentLength=%d with Body length %d", req.ContentLength, n)
		}
		return err
	}
	// The length goes before the body, which is read after it: note where
	// the header ends and fill in the length once the body is in.
	buf.WriteString("Content-Length: ")
	at := buf.Len()
	buf.WriteString("\r\n\r\n")
	n, err := buf.ReadFrom(req.Body)
	req.Body.Close()
	if err != nil {
		return err
	}
	tail := bytes.Clone(buf.Bytes()[at:])
	buf.Truncate(at)
	buf.WriteString(strconv.FormatInt(n, 10))
	buf.Write(tail)
	return nil
}

// get takes the most recently used idle connection that is still open, or
// dials a new one.
func (t *h1Transport) get(ctx context.Context) (*h1Conn, error) {
	for {
		t.mu.Lock()
		n := len(t.idle)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		c := t.idle[n-1]
		t.idle[n-1] = nil
		t.idle = t.idle[:n-1]
		t.mu.Unlock()
		if time.Since(c.idleSince) < t.idleTimeout && open(c.c) {
			return c, nil
		}
		c.c.Close()
	}
	nc, err := t.dial(ctx, "tcp", t.addr)
	if err != nil {
		return nil, err
	}
	return &h1Conn{c: nc, br: bufio.NewReaderSize(nc, t.readBuf)}, nil
}

// put pools c for the next request, or closes it when the pool is full.
func (t *h1Transport) put(c *h1Conn) {
	c.idleSince = time.Now()
	t.mu.Lock()
	if !t.closed && len(t.idle) < t.maxIdle {
		t.idle = append(t.idle, c)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	c.c.Close()
}

// CloseIdleConnections closes the pooled connections (std's too); the
// connections of requests in flight close when their bodies end.
func (t *h1Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.closed = nil, true
	t.mu.Unlock()
	for _, c := range idle {
		c.c.Close()
	}
	t.std.CloseIdleConnections()
}

// h1Body is a response body on its connection: read to its end, it gives
// the connection back to the pool; closed before that, it closes it (the
// server then aborts the request). It never reads on to the end on Close:
// that would wait for a whole generation.
type h1Body struct {
	t     *h1Transport
	c     *h1Conn
	stop  func() bool
	ctx   context.Context
	body  io.ReadCloser
	reuse bool
	done  atomic.Bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.release(true)
	} else if err != nil {
		b.release(false)
		if b.ctx.Err() != nil {
			err = context.Cause(b.ctx)
		}
	}
	return n, err
}

// endBuffered is implemented by a body that can tell that reading it to its
// end makes no system call.
type endBuffered interface{ endBuffered() bool }

// endBuffered reports whether the body has ended already: net/http's reader
// sees a chunked body's end with its last chunk when both came in one read
// (the usual case: servers send them together or right after each other),
// and the connection is then back in the pool.
func (b *h1Body) endBuffered() bool { return b.done.Load() }

func (b *h1Body) Close() error {
	b.release(false)
	return nil
}

// release ends the body's hold on the connection once: pooled when the body
// was read to its end on a connection that may be reused, closed otherwise.
func (b *h1Body) release(atEnd bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	// stop reports false when the request's context has closed the
	// connection already.
	if b.stop() && atEnd && b.reuse && b.c.br.Buffered() == 0 {
		b.t.put(b.c)
		return
	}
	b.c.c.Close()
}
