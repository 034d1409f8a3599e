//go:build !(linux || darwin)

package gateway

import "net"

func peekedBytes(net.Conn) int { return -1 }
