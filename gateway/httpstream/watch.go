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
// connection again. The probes of all of a Server's watchers run from one
// goroutine (prober).
type Watcher struct {
	conn     net.Conn
	stuckFor time.Duration
	waiting  func() bool // frames are waiting for the writer
	cancel   context.CancelCauseFunc
	cause    error
	p        *prober

	last   atomic.Int64 // unix nanoseconds of the last frame
	gone   atomic.Bool
	probes atomic.Int32 // probes made, for tests
	// mu is held by a probe: Stop takes it, so no probe uses the connection
	// once Stop has returned.
	mu      sync.Mutex
	stopped bool
}

// Watch starts watching the client of rc: when it has gone, or frames have
// waited (waiting reports true) StuckTimeout without a Touch, cancel is
// called with cause. Call it from the handler; Stop ends it.
func (s *Server) Watch(rc *fasthttp.RequestCtx, waiting func() bool, cancel context.CancelCauseFunc, cause error) *Watcher {
	return s.probes.watch(rc.Conn(), s.cfg.StuckTimeout, waiting, cancel, cause)
}

// prober probes the connections of a Server's watchers every interval, from
// one goroutine that runs while there are watchers: a goroutine and a ticker
// per request cost their start, the timer heap's work and a hand-shake to
// stop them, for requests that mostly end before their first probe. A probe
// is a non-blocking peek on Linux and macOS (microseconds); elsewhere it is
// a read with a 1 ms deadline, so a tick there takes a millisecond per
// silent stream.
type prober struct {
	interval time.Duration
	mu       sync.Mutex
	ws       map[*Watcher]struct{}
	running  bool
}

func newProber(interval time.Duration) *prober {
	return &prober{interval: interval, ws: map[*Watcher]struct{}{}}
}

func (p *prober) watch(conn net.Conn, stuckFor time.Duration, waiting func() bool, cancel context.CancelCauseFunc, cause error) *Watcher {
	w := &Watcher{conn: conn, stuckFor: stuckFor, waiting: waiting, cancel: cancel, cause: cause, p: p}
	w.last.Store(time.Now().UnixNano())
	if conn == nil {
		w.stopped = true
		return w
	}
	p.mu.Lock()
	p.ws[w] = struct{}{}
	if !p.running {
		p.running = true
		go p.run()
	}
	p.mu.Unlock()
	return w
}

func (p *prober) remove(w *Watcher) {
	p.mu.Lock()
	delete(p.ws, w)
	p.mu.Unlock()
}

// run probes every interval; it returns once a tick finds no watcher (the
// next Watch starts it again).
func (p *prober) run() {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	var batch []*Watcher
	for now := range t.C {
		p.mu.Lock()
		if len(p.ws) == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		for w := range p.ws {
			batch = append(batch, w)
		}
		p.mu.Unlock()
		for _, w := range batch {
			w.probe(now)
		}
		clear(batch) // let stopped watchers go
		batch = batch[:0]
	}
}

// probe checks the client if no frame came for an interval.
func (w *Watcher) probe(now time.Time) {
	w.mu.Lock()
	quiet := now.UnixNano() - w.last.Load()
	if w.stopped || quiet < int64(w.p.interval) {
		w.mu.Unlock()
		return
	}
	w.probes.Add(1)
	// A client that stopped reading blocks the writer in a write while
	// frames pile up: its socket looks alive, so it is cut by time.
	gone := quiet >= int64(w.stuckFor) && w.waiting() || peerGone(w.conn)
	if gone {
		w.stopped = true
		w.gone.Store(true)
	}
	w.mu.Unlock()
	if gone {
		w.p.remove(w)
		w.cancel(w.cause)
	}
}

// Touch records that a frame arrived at t: no probe is needed for a while.
func (w *Watcher) Touch(t time.Time) { w.last.Store(t.UnixNano()) }

// Gone reports whether the watcher found the client gone (or stuck) and
// cancelled the request.
func (w *Watcher) Gone() bool { return w.gone.Load() }

// Stop ends the watcher; once it returns, no probe uses the connection. It
// may be called more than once.
func (w *Watcher) Stop() {
	w.mu.Lock()
	was := w.stopped
	w.stopped = true
	w.mu.Unlock()
	if !was {
		w.p.remove(w)
	}
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
