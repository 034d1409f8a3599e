package httpengine

import (
	"net"
	"syscall"
)

// open reports whether an idle connection can carry a request: the server
// has not closed it (uvicorn closes connections idle for 5 s) and sent
// nothing unasked. One non-blocking peek; net/http learns the same from the
// reader goroutine it keeps on every idle connection.
func open(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// EAGAIN: nothing to read, open. Bytes (n > 0), end of stream
		// (n == 0) or any other error: not usable.
		alive = err == syscall.EAGAIN
		return true
	})
	return err == nil && alive
}
