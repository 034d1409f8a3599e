//go:build linux || darwin

package httpstream

import (
	"net"
	"syscall"
)

// peekedBytes is how many bytes wait in c's socket (up to 16), read without
// consuming them; -1 if the socket could not be asked.
func peekedBytes(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	var buf [16]byte
	_ = raw.Read(func(fd uintptr) bool {
		n, _, _ = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	return n
}
