//go:build !(linux || darwin)

package httpstream

import "syscall"

// peekGone is not available here; peerGone falls back to a read probe.
func peekGone(syscall.Conn) (gone, ok bool) { return false, false }
