package testenv

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Listener is a TCP listener on the loopback that a test holds and that
// serves nothing: where a test needs an address nothing answers on, it
// holds one instead of trusting a port to be closed (port 1, a server it
// closed a moment ago): a port the test does not hold may be taken by
// another program at any time, and one that accepts and stays silent turns
// "connection refused" into a wait.
type Listener struct {
	Addr     string // host:port
	accepted atomic.Int64
}

// Accepted is how many connections reached the listener: 0 where a test
// means to check that nothing was dialed.
func (l *Listener) Accepted() int { return int(l.accepted.Load()) }

// ResetListener holds a listener that resets every connection as soon as it
// is accepted, so that a dial or a request to it fails at once; it closes
// with the test.
func ResetListener(t testing.TB) *Listener {
	t.Helper()
	return hold(t, func(c *net.TCPConn) {
		_ = c.SetLinger(0) // RST, not FIN: the client sees a reset
		_ = c.Close()
	})
}

// SilentListener holds a listener that accepts every connection and never
// answers or closes it (as a stuck program would), so that a test can check
// a client gives up by its deadline; the connections close with the test.
func SilentListener(t testing.TB) *Listener {
	t.Helper()
	return hold(t, nil)
}

// hold listens on a port picked now and runs serve on each accepted
// connection (nil: keep it open and silent until the test ends).
func hold(t testing.TB, serve func(*net.TCPConn)) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Listener{Addr: ln.Addr().String()}
	var mu sync.Mutex
	var open []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("testenv listener %s: %v", l.Addr, err)
				}
				return
			}
			l.accepted.Add(1)
			if serve != nil {
				serve(c.(*net.TCPConn))
				continue
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	})
	return l
}
