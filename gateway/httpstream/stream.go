package httpstream

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
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

	// Writes from another goroutine (Ready, TryFlush): the socket, once
	// looked up, and bytes a TryFlush could not send, which go first.
	raw     syscall.RawConn
	rawDone bool
	rest    []byte
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
	if st.pooled == nil {
		st.take() // readAhead's scratch
	}
	ahead, ok := readAhead(hc, raw, st.buf)
	st.release()
	if !ok {
		_ = raw.Close()
		return
	}
	srv := st.srv
	srv.next.Go(func() { srv.serveNext(raw, ahead) })
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

// keepAlive reports whether a stream of rc may leave its connection open:
// HTTP/1.1 (chunked framing), the client did not ask to close, and the
// server is not draining.
func (s *Server) keepAlive(rc *fasthttp.RequestCtx) bool {
	h := &rc.Request.Header
	return h.IsHTTP11() && !h.ConnectionClose() && !s.idle.draining.Load()
}

// --- Writing: bursts, chunked framing, SSE events ---

// The body is written in bursts, each in one syscall. In chunked mode
// (HTTP/1.1 keep-alive) every burst is one HTTP chunk and the body ends with
// the last chunk, so the connection can serve the client's next request;
// otherwise the body ends when the connection closes.
//
// The buffer holds, in order: the response head until the first burst goes
// out (hlen bytes), chunkHeadroom bytes kept free for the burst's chunk size
// line, then the burst. The size line is written right-aligned in the
// headroom and the head moved up against it, so that head, size line, burst
// and chunk end leave in one contiguous write without a copy of the burst.

// chunkHeadroom is room for a chunk's size line: up to 8 hex digits and CRLF.
const chunkHeadroom = 10

// burstSize is the burst a write carries before it is flushed anyway.
const burstSize = 32 << 10

// bufCap is the capacity of a pooled buffer: a burst with its framing and a
// response head of ordinary size. Buffers that grew past maxPooled (a head or
// a single event larger than that) are left to the garbage collector.
const (
	bufCap    = chunkHeadroom + burstSize + 2<<10
	maxPooled = 2 * bufCap
)

var bufs = sync.Pool{New: func() any {
	b := make([]byte, 0, bufCap)
	return &b
}}

// add appends p to the burst, flushing when the burst is full.
func (st *Stream) add(p []byte) error {
	if st.err != nil {
		return st.err
	}
	if st.pooled == nil {
		st.take()
	}
	st.buf = append(st.buf, p...)
	if len(st.buf)-st.hlen-chunkHeadroom >= burstSize {
		return st.flush(false)
	}
	return nil
}

// flush sends the head (if not sent yet) and the burst; with last, the end
// of the body too.
func (st *Stream) flush(last bool) error { return st.send(last, false) }

// send is flush; with now, it writes only what the socket takes at once and
// keeps the rest in st.rest for the next flush.
func (st *Stream) send(last, now bool) error {
	if st.err != nil {
		return st.err
	}
	if len(st.rest) > 0 { // what a TryFlush left: it goes first
		_, st.err = st.conn.Write(st.rest)
		st.rest = nil
		if st.err != nil {
			return st.err
		}
	}
	if st.pooled == nil { // nothing added since the last flush
		if !last {
			return nil
		}
		st.take()
	}
	if !st.live && !last {
		// Before Run on a connection that may hold an earlier response:
		// Run sends it (see Flush).
		st.pending = true
		return nil
	}
	base := st.hlen + chunkHeadroom
	n := len(st.buf) - base
	if n == 0 && !(last && st.chunked) && st.hlen == 0 {
		return nil
	}
	start := base
	if st.chunked {
		if n > 0 {
			var size [chunkHeadroom]byte
			line := strconv.AppendUint(size[:0], uint64(n), 16)
			line = append(line, '\r', '\n')
			start = base - len(line)
			copy(st.buf[start:], line)
			st.buf = append(st.buf, '\r', '\n')
		}
		if last {
			st.buf = append(st.buf, "0\r\n\r\n"...)
		}
	}
	if st.hlen > 0 {
		copy(st.buf[start-st.hlen:start], st.buf[:st.hlen]) // overlapping: a memmove
		start -= st.hlen
		st.hlen = 0
	}
	if now {
		var n int
		n, st.err = tryWrite(st.raw, st.buf[start:])
		if st.err == nil && n < len(st.buf)-start {
			st.rest = append([]byte(nil), st.buf[start+n:]...)
		}
	} else {
		_, st.err = st.conn.Write(st.buf[start:])
	}
	st.buf = st.buf[:chunkHeadroom]
	st.pending = false
	if !last {
		// Between bursts the buffer goes back to the pool: at a model's
		// pace a stream is idle nearly all the time, and 10,000 streams
		// would otherwise hold 350 MB of them.
		st.release()
	}
	return st.err
}

// Ready reports whether the stream may be written from another goroutine
// now (WriteEvents, then TryFlush): while its Run function waits for the
// next frame, on a plain socket, with nothing of an earlier burst unsent.
// Calls to Ready, WriteEvents and TryFlush from another goroutine must not
// overlap the Run function's own use of the stream (client.Stream.Direct
// sees to that).
func (st *Stream) Ready() bool {
	if !st.rawDone {
		st.raw, st.rawDone = rawConn(st.conn), true
	}
	return st.raw != nil && st.running && st.live && st.err == nil && st.pooled == nil && len(st.rest) == 0 &&
		st.state.Load() == stateOpen
}

// TryFlush is Flush without waiting: it reports whether the burst went out
// whole. If it did not, the rest (or the write's error) waits for the next
// Flush, which the Run function must make.
func (st *Stream) TryFlush() bool {
	err := st.send(false, true)
	return err == nil && len(st.rest) == 0
}

// take gets a pooled buffer for the next burst, with room for its chunk
// size line in front (the response head has been sent: take follows a
// release, which follows a flush).
func (st *Stream) take() {
	st.pooled = bufs.Get().(*[]byte)
	st.buf = (*st.pooled)[:chunkHeadroom]
}

// release returns the buffer to the pool, if the stream holds one.
func (st *Stream) release() {
	if st.pooled == nil {
		return
	}
	if cap(st.buf) <= maxPooled {
		*st.pooled = st.buf[:0]
		bufs.Put(st.pooled)
	}
	st.buf, st.pooled = nil, nil
}

// The bytes of an SSE stream on /v1: data lines only, no ids or event names
// (some OpenAI SDKs break on those), and comments only as keep-alives before
// the first token of a request held for capacity (Comment). The Responses
// API's streams are the exception: named events (WriteEvent), as OpenAI
// sends them, and no [DONE] (End).
var (
	sseData = []byte("data: ")
	sseEnd  = []byte("\n\n")
	sseDone = []byte("data: [DONE]\n\n")
)

var errNotRunning = errors.New("httpstream: Done or Fail outside the function given to Run")

// WriteEvents adds every line of payload (a chunk frame's payload: one JSON
// object per line) as one event, "data: <line>\n\n", byte for byte. It
// returns the number of events and the first write error. Flush sends them.
func (st *Stream) WriteEvents(payload []byte) (int, error) {
	n := 0
	err := schemas.ForEachLine(payload, func(line []byte) error {
		n++
		_ = st.add(sseData)
		_ = st.add(line)
		return st.add(sseEnd)
	})
	return n, err
}

// Comment adds an SSE comment line, ": text\n\n", which SSE parsers skip:
// a keep-alive while a stream has nothing to send (a request held for
// capacity before its first token). Flush sends it.
func (st *Stream) Comment(text string) error {
	_ = st.add(sseComment)
	_ = st.add([]byte(text))
	return st.add(sseEnd)
}

var sseComment = []byte(": ")

var sseEvent = []byte("event: ")

// WriteEvent adds one named event, "event: <name>\ndata: <data>\n\n": the
// Responses API's form (its SDKs read the name; chat's do not take one).
// data must be one line (compact JSON). Flush sends it.
func (st *Stream) WriteEvent(name string, data []byte) error {
	_ = st.add(sseEvent)
	_ = st.add([]byte(name))
	_ = st.add([]byte("\n"))
	_ = st.add(sseData)
	_ = st.add(data)
	return st.add(sseEnd)
}

// End ends the stream as it is, with no [DONE]: a Responses stream ends
// after its terminal event. Like Done, it belongs to the function given
// to Run.
func (st *Stream) End() error {
	if !st.running {
		return errNotRunning
	}
	return st.end()
}

// Done ends the stream: [DONE] and the end of the body, sent.
func (st *Stream) Done() error {
	if !st.running {
		return errNotRunning
	}
	if err := st.add(sseDone); err != nil {
		return err
	}
	return st.end()
}

// Fail ends a stream that failed after its first byte: the error in-band as
// OpenAI clients expect it, data: {"error":{...}}, then [DONE].
func (st *Stream) Fail(e *schemas.Error) error {
	if !st.running {
		return errNotRunning
	}
	_ = st.add(sseData)
	_ = st.add(e.JSON())
	_ = st.add(sseEnd)
	return st.Done()
}
