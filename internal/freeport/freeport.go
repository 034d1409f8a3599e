package freeport

import "net"

// TCP returns a TCP port free on the loopback a moment ago. The port is
// free when it returns; nothing on a machine picks fixed ports from the
// ephemeral range, so the race until the caller binds it is harmless.
func TCP() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
