package gateway

import (
	"net"
	"strconv"
	"sync"
)

// streamWriter writes an SSE body straight to a hijacked connection, one
// syscall per burst. In chunked mode (HTTP/1.1 keep-alive) every burst is
// one HTTP chunk and End writes the last chunk, so the connection can serve
// the client's next request: OpenAI clients keep a connection pool, and
// closing after every stream would cost them a TCP (and TLS) handshake per
// request. Otherwise the body ends when the connection closes.
//
// Errors are sticky: after the first failed write every call returns it.
type streamWriter struct {
	conn    net.Conn
	chunked bool
	head    []byte // the response head, sent with the first burst
	buf     []byte // chunkHeadroom bytes kept free for the chunk size, then the burst
	err     error
}

// chunkHeadroom is room for a chunk's size line: up to 8 hex digits and CRLF.
const chunkHeadroom = 10

// streamBufSize is the burst a write carries before it is flushed anyway.
const streamBufSize = 32 << 10

var streamBufs = sync.Pool{New: func() any {
	b := make([]byte, chunkHeadroom, chunkHeadroom+streamBufSize+64)
	return &b
}}

func newStreamWriter(conn net.Conn, chunked bool) *streamWriter {
	return &streamWriter{conn: conn, chunked: chunked, buf: (*streamBufs.Get().(*[]byte))[:chunkHeadroom]}
}

// WriteHead sets the response head: it goes out, outside the chunked
// framing, in the same syscall as the first burst.
func (w *streamWriter) WriteHead(p []byte) { w.head = p }

// Write adds p to the burst.
func (w *streamWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	w.buf = append(w.buf, p...)
	if len(w.buf)-chunkHeadroom >= streamBufSize {
		return len(p), w.Flush()
	}
	return len(p), nil
}

// Flush sends the burst.
func (w *streamWriter) Flush() error { return w.flush(false) }

// End sends the burst and, in chunked mode, the body's last chunk.
func (w *streamWriter) End() error { return w.flush(true) }

func (w *streamWriter) flush(last bool) error {
	if w.err != nil {
		return w.err
	}
	n := len(w.buf) - chunkHeadroom
	if n == 0 && !(last && w.chunked) && w.head == nil {
		return nil
	}
	start := chunkHeadroom
	if w.chunked {
		if n > 0 {
			var size [chunkHeadroom]byte
			head := strconv.AppendUint(size[:0], uint64(n), 16)
			head = append(head, '\r', '\n')
			start = chunkHeadroom - len(head)
			copy(w.buf[start:], head)
			w.buf = append(w.buf, '\r', '\n')
		}
		if last {
			w.buf = append(w.buf, "0\r\n\r\n"...)
		}
	}
	out := w.buf[start:]
	if w.head != nil {
		out = append(w.head, out...)
		w.head = nil
	}
	_, w.err = w.conn.Write(out)
	w.buf = w.buf[:chunkHeadroom]
	return w.err
}

// release returns the buffer; w must not be used after.
func (w *streamWriter) release() {
	if cap(w.buf) <= chunkHeadroom+streamBufSize+64 {
		b := w.buf[:chunkHeadroom]
		streamBufs.Put(&b)
	}
	w.buf = nil
}
