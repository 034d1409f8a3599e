//go:build !(linux || darwin)

package httpstream

import "net"

func peekedBytes(net.Conn) int { return -1 }
