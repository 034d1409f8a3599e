package httpstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// tcpPair is a connected loopback pair: the server's end and the client's.
func tcpPair(t *testing.T) (srv, cli net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	srv, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, cli
}

// hideSyscall hides a TCP connection's syscall.Conn so that peerGone takes
// the portable read probe.
type hideSyscall struct{ net.Conn }

// Both probes tell a quiet client from one that hung up, and the peek does
// not consume a byte the client sent.
func TestPeerGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"peek", func(c net.Conn) net.Conn { return c }},
		{"read deadline", func(c net.Conn) net.Conn { return hideSyscall{c} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := tcpPair(t)
			conn := tc.wrap(srv)
			// fasthttp's request read deadline expires during long requests.
			_ = srv.SetReadDeadline(time.Now().Add(-time.Second))
			if peerGone(conn) {
				t.Fatal("a quiet client looks gone")
			}
			if tc.name == "peek" {
				_, _ = cli.Write([]byte("G"))
				if peekedBytes(srv) >= 0 { // the byte is there before the probe looks
					testenv.WaitFor(t, time.Second, func() error {
						if n := peekedBytes(srv); n != 1 {
							return fmt.Errorf("%d bytes waiting", n)
						}
						return nil
					})
				}
				if peerGone(conn) {
					t.Fatal("a client with a byte pending looks gone")
				}
				_ = srv.SetReadDeadline(time.Now().Add(time.Second)) // a consumed byte fails here, not after 10 minutes
				buf := make([]byte, 1)
				if n, err := srv.Read(buf); n != 1 || buf[0] != 'G' || err != nil {
					t.Fatalf("the peek consumed data: %d %v", n, err)
				}
			}
			_ = cli.Close()
			testenv.WaitFor(t, time.Second, func() error {
				if !peerGone(conn) {
					return errors.New("a client that hung up looks there")
				}
				return nil
			})
			// The deadline is reset: a later read blocks as usual, with EOF here.
			if tc.name != "peek" {
				if _, err := srv.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("read after probe: %v", err)
				}
			}
		})
	}
}

var errTestGone = errors.New("client gone")

// A watcher leaves a quiet client alone, and notices within about one
// ProbeInterval a client that hung up while the request is silent.
func TestWatcherNoticesHangUp(t *testing.T) {
	const interval = 50 * time.Millisecond
	srv, cli := tcpPair(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	w := newProber(interval).watch(srv, time.Hour, func() bool { return false }, cancel, errTestGone)
	defer w.Stop()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := w.probes.Load(); n < 3 {
			return fmt.Errorf("%d probes", n)
		}
		return nil
	})
	if ctx.Err() != nil || w.Gone() {
		t.Fatalf("a quiet client was taken for gone: %v", context.Cause(ctx))
	}
	hungUp := time.Now()
	_ = cli.Close()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a client that hung up was not noticed")
	}
	// One interval until the next probe; the rest is room for a busy machine.
	if d := time.Since(hungUp); d > 4*interval {
		t.Errorf("noticed after %s, probing every %s", d, interval)
	}
	if context.Cause(ctx) != errTestGone || !w.Gone() {
		t.Fatalf("cause %v, gone %v", context.Cause(ctx), w.Gone())
	}
}

// One prober serves many watchers: a stopped watcher is never probed again,
// the others go on, a hung-up client among them is noticed, and the probing
// goroutine ends once no watcher is left.
func TestProberSharedAndStops(t *testing.T) {
	const interval = 20 * time.Millisecond
	p := newProber(interval)
	type watched struct {
		w   *Watcher
		cli net.Conn
		ctx context.Context
	}
	var ws []watched
	for range 3 {
		srv, cli := tcpPair(t)
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		ws = append(ws, watched{p.watch(srv, time.Hour, func() bool { return false }, cancel, errTestGone), cli, ctx})
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		for i, x := range ws {
			if n := x.w.probes.Load(); n < 2 {
				return fmt.Errorf("watcher %d: %d probes", i, n)
			}
		}
		return nil
	})
	ws[0].w.Stop()
	stoppedAt := ws[0].w.probes.Load()
	_ = ws[0].cli.Close() // stopped: its hang-up is not its watcher's business any more
	_ = ws[1].cli.Close()
	select {
	case <-ws[1].ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a client that hung up was not noticed")
	}
	before := ws[2].w.probes.Load()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := ws[2].w.probes.Load(); n < before+2 {
			return fmt.Errorf("the quiet watcher got %d probes since", n-before)
		}
		return nil
	})
	if n := ws[0].w.probes.Load(); n != stoppedAt || ws[0].ctx.Err() != nil {
		t.Fatalf("a stopped watcher was probed (%d → %d) or cancelled (%v)", stoppedAt, n, ws[0].ctx.Err())
	}
	if !ws[1].w.Gone() || ws[2].w.Gone() || ws[2].ctx.Err() != nil {
		t.Fatalf("gone: %v %v; the quiet one's context: %v", ws[1].w.Gone(), ws[2].w.Gone(), ws[2].ctx.Err())
	}
	ws[2].w.Stop()
	ws[2].w.Stop() // twice is fine
	testenv.WaitFor(t, 5*time.Second, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.running || len(p.ws) != 0 {
			return fmt.Errorf("running %v with %d watchers", p.running, len(p.ws))
		}
		return nil
	})
}
