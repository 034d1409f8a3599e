//go:build unix

package httpstream

import (
	"net"
	"syscall"
)

// rawConn is c's socket, for writes that must not wait; nil when c has none
// (TLS, a pipe in tests).
func rawConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// tryWrite writes what the socket takes of b now, without waiting: n < len(b)
// with a nil error means the socket's buffer is full.
func tryWrite(rc syscall.RawConn, b []byte) (int, error) {
	var (
		n    int
		werr error
	)
	err := rc.Write(func(fd uintptr) bool {
		n, werr = syscall.Write(int(fd), b)
		return true // never wait for room
	})
	if err != nil {
		return 0, err
	}
	if n < 0 {
		n = 0
	}
	if werr == syscall.EAGAIN || werr == syscall.EWOULDBLOCK || werr == syscall.EINTR {
		werr = nil
	}
	return n, werr
}
