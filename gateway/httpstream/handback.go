package httpstream

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// fasthttp serves nothing more on a hijacked connection, so after a stream
// that ended cleanly Run hands the connection back with Server.ServeConn:
// the client's next request on it is served as on any keep-alive connection
// (OpenAI clients keep a connection pool; closing after every stream would
// cost them a TCP and TLS handshake per request).

// maxPipelined bounds the bytes a client may have sent ahead of a stream's
// end (HTTP pipelining, which no OpenAI client does); past it the connection
// is closed.
const maxPipelined = 1 << 20

// longAgo is a deadline in the past: a read with it returns at once.
var longAgo = time.Unix(1, 0)

// readAhead returns the bytes the client sent after the stream's request,
// read with scratch as the buffer; ok is false when the connection cannot be
// served again. hc is the hijacked connection fasthttp gave Run: its reader
// holds any bytes fasthttp read past the request, which come first. Reading
// hc with an expired deadline on raw returns those without waiting.
func readAhead(hc, raw net.Conn, scratch []byte) (ahead []byte, ok bool) {
	if err := raw.SetReadDeadline(longAgo); err != nil {
		return nil, false
	}
	scratch = scratch[:cap(scratch)]
	for {
		n, err := hc.Read(scratch)
		ahead = append(ahead, scratch[:n]...)
		if err != nil || n == 0 {
			break
		}
		if len(ahead) > maxPipelined {
			return nil, false
		}
	}
	// fasthttp serves a handed-back connection as a new one: its
	// ReadTimeout bounds the wait for the next request.
	if err := raw.SetReadDeadline(time.Time{}); err != nil {
		return nil, false
	}
	return ahead, true
}

// serveNext serves the next requests on raw, ahead first. It returns when
// the connection closes (ServeConn closes it) or when a next stream hijacks
// it (that stream's Run owns it then).
func (s *Server) serveNext(raw net.Conn, ahead []byte) {
	conn, ok := raw.(*handedConn)
	if ok {
		// Handed back before: its earlier ahead bytes were all read, and
		// nothing else holds it.
		conn.ahead = ahead
		conn.seen.Store(false)
	} else {
		conn = &handedConn{Conn: raw, ahead: ahead, idle: &s.idle}
	}
	if !s.idle.add(conn) {
		_ = raw.Close()
		return
	}
	_ = s.srv.ServeConn(conn)
	s.idle.forget(conn)
}

// handedBack tracks handed-back connections until the first bytes of their
// next request arrive. fasthttp's Shutdown closes the idle keep-alive
// connections it knows of, but it learns of a connection given to ServeConn
// only once a request on it has been answered; until then Shutdown would
// wait for the read timeout.
type handedBack struct {
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	n        atomic.Int32 // len(conns), read without the lock
	draining atomic.Bool  // set under mu by closeAll
}

// add records c unless the server is draining (checked under the lock
// closeAll takes, so that no connection slips past it).
func (h *handedBack) add(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining.Load() {
		return false
	}
	if h.conns == nil {
		h.conns = make(map[net.Conn]struct{})
	}
	h.conns[c] = struct{}{}
	h.n.Store(int32(len(h.conns)))
	return true
}

// forget drops c, if tracked; it costs one atomic load when none is.
func (h *handedBack) forget(c net.Conn) {
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	delete(h.conns, c)
	h.n.Store(int32(len(h.conns)))
	h.mu.Unlock()
}

// closeAll closes the connections still waiting for a request and refuses
// any more.
func (h *handedBack) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.draining.Store(true)
	for c := range h.conns {
		_ = c.Close()
	}
	clear(h.conns)
	h.n.Store(0)
}

// handedConn is a handed-back connection. Its reads return first the bytes
// the client sent ahead; the first byte read tells the tracker that fasthttp
// has the connection in hand.
type handedConn struct {
	net.Conn
	ahead []byte
	idle  *handedBack
	seen  atomic.Bool
}

func (c *handedConn) Read(p []byte) (int, error) {
	var (
		n   int
		err error
	)
	if len(c.ahead) > 0 {
		n = copy(p, c.ahead)
		c.ahead = c.ahead[n:]
	} else {
		n, err = c.Conn.Read(p)
	}
	if n == 0 && !c.seen.Load() && errors.Is(err, net.ErrClosed) {
		// closeAll closed it while it waited for a request (shutdown): to
		// fasthttp that is a client that went away (io.EOF), not an error
		// it would answer, and log, as a 500.
		err = io.EOF
	}
	if n > 0 && !c.seen.Load() {
		c.seen.Store(true)
		c.idle.forget(c)
	}
	return n, err
}

// SyscallConn lets the watcher peek at the socket.
func (c *handedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}
