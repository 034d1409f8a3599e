package httpstream

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Stream is one SSE response, written straight to its connection. See the
// package doc for who may call what, and when.
type Stream struct {
	srv     *Server
	rc      *fasthttp.RequestCtx // until Run; nil after
	conn    net.Conn
	watcher *Watcher
	chunked bool // HTTP/1.1 keep-alive: chunked body, connection reused after a clean end
	live    bool // bytes may go to the connection now
	running bool // in the function given to Run
	pending bool // a Flush waits for Run
	hlen    int  // bytes of the response head at the start of buf, not sent yet
	buf     []byte
	pooled  *[]byte
	err     error
	ctx     context.Context
	fn      func(*Stream)
	state   atomic.Int32 // stateOpen, then stateEnded or stateCut
}

const (
	stateOpen  = iota
	stateEnded // Done or Fail ended the body cleanly: the connection may be reused
	stateCut   // the context ended first: writes have a deadline, the connection is closed
)

// Begin starts the 200 text/event-stream response of rc, with every header
// set on rc's response so far (request id, rate limits...), except those the
// stream sets itself. w, if not nil, is the request's watcher: Run stops it
// before the connection may serve another request. Call Begin from the
// handler; nothing is sent yet.
func (s *Server) Begin(rc *fasthttp.RequestCtx, w *Watcher) *Stream {
	st := newStream(s, rc.Conn(), s.keepAlive(rc))
	st.rc, st.watcher = rc, w
	// On a connection's first request nothing of an earlier response can
	// be waiting in fasthttp's buffer, so the first burst may leave from
	// the handler's goroutine, without waiting for the hijack goroutine to
	// be scheduled.
	st.live = rc.ConnRequestNum() == 1
	st.appendHead(&rc.Response.Header)
	st.startBody()
	return st
}

func newStream(s *Server, conn net.Conn, chunked bool) *Stream {
	p := bufs.Get().(*[]byte)
	return &Stream{srv: s, conn: conn, chunked: chunked, pooled: p, buf: (*p)[:0]}
}

// startBody marks what the buffer holds so far as the response head.
func (st *Stream) startBody() {
	st.hlen = len(st.buf)
	var headroom [chunkHeadroom]byte
	st.buf = append(st.buf, headroom[:]...)
}

// appendHead writes the response head at the start of the buffer.
func (st *Stream) appendHead(h *fasthttp.ResponseHeader) {
	b := append(st.buf, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"...)
	if st.chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	} else {
		b = append(b, "Connection: close\r\n"...)
	}
	h.VisitAll(func(k, v []byte) {
		if ownHeader(k) {
			return
		}
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, "\r\n"...)
	})
	st.buf = append(b, "\r\n"...)
}

// ownHeaders are the headers the stream sets itself (or must not send).
var ownHeaders = [][]byte{
	[]byte("Content-Type"), []byte("Content-Length"), []byte("Transfer-Encoding"),
	[]byte("Connection"), []byte("Cache-Control"), []byte("X-Accel-Buffering"),
}

func ownHeader(k []byte) bool {
	for _, h := range ownHeaders {
		if bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// Flush sends what was written since the last one, in one syscall. Before
// Run, on a connection whose earlier response fasthttp may still hold, the
// bytes wait until Run.
func (st *Stream) Flush() error { return st.flush(false) }

// Err is the first write error, or nil.
func (st *Stream) Err() error { return st.err }

// Run hijacks the connection: once the handler has returned, fn runs on a
// new goroutine with the stream. When ctx ends, writes get one second more
// and the connection is not reused. After fn returns, Run stops the watcher
// given to Begin and hands the connection back to fasthttp if the body ended
// cleanly (see the package doc), else closes it. The handler must return
// right after Run.
func (st *Stream) Run(ctx context.Context, fn func(*Stream)) {
	st.ctx, st.fn = ctx, fn
	rc := st.rc
	st.rc = nil
	rc.HijackSetNoResponse(true)
	rc.Hijack(st.serve)
}

// serve is the hijack handler: hc reads through fasthttp's buffer, st.conn
// is the connection itself.
func (st *Stream) serve(hc net.Conn) {
	st.live, st.running = true, true
	stopCut := context.AfterFunc(st.ctx, st.cut)
	if st.pending {
		_ = st.flush(false)
	}
	st.fn(st)
	stopCut()
	if st.watcher != nil {
		st.watcher.Stop() // it reads the connection; fasthttp is about to
	}
	raw := st.conn
	if st.state.Load() != stateEnded || !st.chunked {
		st.release()
		_ = raw.Close()
		return
	}
	ahead, ok := readAhead(hc, raw, st.buf)
	st.release()
	if !ok {
		_ = raw.Close()
		return
	}
	st.srv.serveNext(raw, ahead)
}

// cut runs when the stream's context ends: a client that reads nothing must
// not hold the writer, and a connection cut mid-body is not reused.
func (st *Stream) cut() {
	if st.state.CompareAndSwap(stateOpen, stateCut) {
		_ = st.conn.SetWriteDeadline(time.Now().Add(cutGrace))
	}
}

// end sends the end of the body. A body that ended before the stream's
// context leaves the connection reusable.
func (st *Stream) end() error {
	if err := st.flush(true); err != nil {
		return err
	}
	if st.ctx.Err() == nil {
		st.state.CompareAndSwap(stateOpen, stateEnded)
	}
	return nil
}
