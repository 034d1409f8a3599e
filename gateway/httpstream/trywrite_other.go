//go:build !unix

package httpstream

import (
	"net"
	"syscall"
)

// rawConn: no writes without waiting here; streams write from their own
// goroutine only (Stream.Ready is false).
func rawConn(net.Conn) syscall.RawConn { return nil }

func tryWrite(syscall.RawConn, []byte) (int, error) { return 0, syscall.EINVAL }
