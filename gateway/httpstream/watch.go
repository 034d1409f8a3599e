package httpstream

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Watcher notices a client that hung up while its request is silent.
// fasthttp gives handlers no cancel signal and a write error needs something
// to write, so every ProbeInterval without a frame (Touch) the watcher
// probes the connection; when the peer has gone it cancels the request's
// context. It does the same when frames have waited StuckTimeout for a
// writer blocked on a client that reads nothing.
//
// It runs from Watch until Stop (the handler's, for a request answered
// without a stream; Run's, after a stream): after that fasthttp may read the
// connection again.
type Watcher struct {
	conn     net.Conn
	interval time.Duration
	stuckFor time.Duration
	waiting  func() bool // frames are waiting for the writer
	cancel   context.CancelCauseFunc
	cause    error

	last   atomic.Int64 // unix nanoseconds of the last frame
	gone   atomic.Bool
	probes atomic.Int32 // probes made, for tests
	stopc  chan struct{}
	donec  chan struct{}
	once   sync.Once
}

// Watch starts watching the client of rc: when it has gone, or frames have
// waited (waiting reports true) StuckTimeout without a Touch, cancel is
// called with cause. Call it from the handler; Stop ends it.
func (s *Server) Watch(rc *fasthttp.RequestCtx, waiting func() bool, cancel context.CancelCauseFunc, cause error) *Watcher {
	return watch(rc.Conn(), s.cfg.ProbeInterval, s.cfg.StuckTimeout, waiting, cancel, cause)
}

func watch(conn net.Conn, interval, stuckFor time.Duration, waiting func() bool, cancel context.CancelCauseFunc, cause error) *Watcher {
	w := &Watcher{conn: conn, interval: interval, stuckFor: stuckFor, waiting: waiting, cancel: cancel, cause: cause,
		stopc: make(chan struct{}), donec: make(chan struct{})}
	w.last.Store(time.Now().UnixNano())
	if conn == nil {
		close(w.donec)
		return w
	}
	go w.run()
	return w
}

func (w *Watcher) run() {
	defer close(w.donec)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.stopc:
			return
		case now := <-t.C:
			quiet := now.UnixNano() - w.last.Load()
			if quiet < int64(w.interval) {
				continue
			}
			w.probes.Add(1)
			// A client that stopped reading blocks the writer in a write while
			// frames pile up: its socket looks alive, so it is cut by time.
			if quiet >= int64(w.stuckFor) && w.waiting() || peerGone(w.conn) {
				w.gone.Store(true)
				w.cancel(w.cause)
				return
			}
		}
	}
}

// Touch records that a frame arrived at t: no probe is needed for a while.
func (w *Watcher) Touch(t time.Time) { w.last.Store(t.UnixNano()) }

// Gone reports whether the watcher found the client gone (or stuck) and
// cancelled the request.
func (w *Watcher) Gone() bool { return w.gone.Load() }

// Stop ends the watcher and waits until it no longer uses the connection.
// It may be called more than once.
func (w *Watcher) Stop() {
	w.once.Do(func() { close(w.stopc) })
	<-w.donec
}

// peerGone reports whether the other end of conn has closed it or the
// connection is broken. It consumes no data where it can peek.
func peerGone(conn net.Conn) bool {
	// fasthttp's ReadTimeout deadline from reading the request is still set
	// and expires during a long request; an expired deadline fails every read,
	// the peek included. Nothing else reads the connection until the response
	// is done, and fasthttp sets a new deadline before reading the next request.
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return true // closed
	}
	if sc, ok := conn.(syscall.Conn); ok {
		if gone, ok := peekGone(sc); ok {
			return gone
		}
	}
	return readProbeGone(conn)
}

// readProbeGone is the portable probe: a one-byte Read with a 1 ms deadline.
// A timeout means the client is there and quiet; end of file or any other
// error means it is gone. A byte read (a pipelined request) is lost, which
// is why peekGone is preferred.
func readProbeGone(conn net.Conn) bool {
	if err := conn.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		return true // closed
	}
	var buf [1]byte
	n, err := conn.Read(buf[:])
	_ = conn.SetReadDeadline(time.Time{})
	if n > 0 || err == nil {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return true
}
