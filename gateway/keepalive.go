package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
)

// A stream is written on a hijacked connection (see completions). fasthttp
// serves nothing more on a hijacked connection, so after a stream that ended
// cleanly the gateway hands the connection back with Server.ServeConn: the
// client's next request on it is served as on any keep-alive connection.
// Server.KeepHijackedConns is set so that fasthttp does not close the
// connection when the hijack handler returns; the handler closes it itself
// when it does not hand it back.

// keepAlive reports whether the stream of c may leave its connection open:
// HTTP/1.1 (chunked framing), the client did not ask to close, and the
// gateway is not shutting down.
func (g *Gateway) keepAlive(c *fiber.Ctx) bool {
	h := &c.Context().Request.Header
	return h.IsHTTP11() && !h.ConnectionClose() && !g.draining.Load()
}

// maxPipelined bounds the bytes a client may have sent ahead of a stream's
// end (HTTP pipelining, which no OpenAI client does); past it the connection
// is closed.
const maxPipelined = 1 << 20

// longAgo is a deadline in the past: a read with it returns at once.
var longAgo = time.Unix(1, 0)

// resume serves the next requests on raw once its stream has ended. hc is
// the hijacked connection fasthttp gave the handler: its reader holds any
// bytes fasthttp read past this request, which must come first. Reading hc
// with an expired deadline on raw returns those without waiting.
func (g *Gateway) resume(hc, raw net.Conn) {
	var ahead []byte
	if err := raw.SetReadDeadline(longAgo); err != nil {
		_ = raw.Close()
		return
	}
	var b [4096]byte
	for {
		n, err := hc.Read(b[:])
		ahead = append(ahead, b[:n]...)
		if err != nil || n == 0 {
			break
		}
		if len(ahead) > maxPipelined {
			_ = raw.Close()
			return
		}
	}
	// fasthttp serves a handed-back connection as a new one: its
	// ReadTimeout bounds the wait for the next request.
	if err := raw.SetReadDeadline(time.Time{}); err != nil {
		_ = raw.Close()
		return
	}
	conn := raw
	if len(ahead) > 0 {
		conn = &aheadConn{Conn: raw, ahead: ahead}
	}
	if !g.resumed.add(conn, &g.draining) {
		_ = raw.Close()
		return
	}
	// ServeConn returns when the connection closes (it closes it) or when a
	// next stream hijacks it (that stream's handler owns it then).
	_ = g.app.Server().ServeConn(conn)
	g.resumed.remove(conn)
}

// resumed tracks handed-back connections until their next request starts.
// fasthttp's Shutdown closes the idle keep-alive connections it knows of,
// but it learns of a connection given to ServeConn only when a request
// arrives on it; until then Shutdown would wait for the read timeout.
type resumed struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	n     atomic.Int32 // len(conns), read without the lock
}

// add records c unless the gateway is draining (checked under the lock
// closeAll takes, so that no connection slips past it).
func (r *resumed) add(c net.Conn, draining *atomic.Bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if draining.Load() {
		return false
	}
	if r.conns == nil {
		r.conns = make(map[net.Conn]struct{})
	}
	r.conns[c] = struct{}{}
	r.n.Store(int32(len(r.conns)))
	return true
}

func (r *resumed) remove(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.n.Store(int32(len(r.conns)))
	r.mu.Unlock()
}

// started is called when a request starts on c: from then on fasthttp
// tracks the connection (idle after the response, or hijacked again).
func (r *resumed) started(c net.Conn) {
	if r.n.Load() == 0 {
		return
	}
	r.remove(c)
}

// closeAll closes the connections still waiting for a request.
func (r *resumed) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		_ = c.Close()
	}
	clear(r.conns)
	r.n.Store(0)
}

// aheadConn is a connection whose first bytes were already read.
type aheadConn struct {
	net.Conn
	ahead []byte
}

func (c *aheadConn) Read(p []byte) (int, error) {
	if len(c.ahead) > 0 {
		n := copy(p, c.ahead)
		c.ahead = c.ahead[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// SyscallConn lets the client-gone probe peek at the socket.
func (c *aheadConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}
