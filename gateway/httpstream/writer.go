package httpstream

import (
	"strconv"
	"sync"
)

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
	st.buf = append(st.buf, p...)
	if len(st.buf)-st.hlen-chunkHeadroom >= burstSize {
		return st.flush(false)
	}
	return nil
}

// flush sends the head (if not sent yet) and the burst; with last, the end
// of the body too.
func (st *Stream) flush(last bool) error {
	if st.err != nil {
		return st.err
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
	_, st.err = st.conn.Write(st.buf[start:])
	st.buf = st.buf[:chunkHeadroom]
	st.pending = false
	return st.err
}

// release returns the buffer to the pool.
func (st *Stream) release() {
	if cap(st.buf) <= maxPooled {
		*st.pooled = st.buf[:0]
		bufs.Put(st.pooled)
	}
	st.buf, st.pooled = nil, nil
}
