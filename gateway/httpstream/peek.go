//go:build linux || darwin

package httpstream

import (
	"errors"
	"os"
	"syscall"
)

// peekGone asks the kernel, without blocking and without consuming anything,
// whether the connection has data, is at end of file or is broken. ok is
// false when the socket could not be asked.
func peekGone(sc syscall.Conn) (gone, ok bool) {
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var (
		n    int
		rerr error
		buf  [1]byte
	)
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readiness
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, false // cannot tell; let the read probe decide
	case err != nil: // the connection was closed on our side
		return true, true
	case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK || rerr == syscall.EINTR:
		return false, true // nothing to read: the client is waiting
	case rerr != nil: // ECONNRESET and the like
		return true, true
	case n == 0: // orderly shutdown from the peer: EOF
		return true, true
	}
	return false, true // data pending (a pipelined request): the client is there
}
