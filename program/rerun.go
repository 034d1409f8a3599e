package program

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A program runs on one NATS connection, which nats.go keeps up through
// disconnects, server restarts and moves between cluster nodes. Only two
// things end it for good: the program closing it, and nats.go giving it up
// when the server answers a protocol error by closing it (a subject longer
// than the server's control line, a payload over its limit: a protocol line
// the program should never have sent, but one a client's input once made it
// send). A run is a program's parts on one connection; when nats.go gives a
// run's connection up, its keeper starts the next run on a new connection,
// in the same process, and then closes the old one. The process never exits
// for it: listeners and engines belong to the process (the keeper's program)
// and are lent to each run. Meanwhile the old run still answers: /ready
// says 503 bus_unavailable, requests 503.

// run is one run of a program: a life whose parts use one NATS connection.
type run interface {
	Done() <-chan struct{}
	Wait() error
	Close() error
	// lost is closed once nats.go gave the run's connection up (never
	// when the run closes it itself).
	lost() <-chan struct{}
	// conn is the run's connection, for the log line of its loss.
	conn() *nats.Conn
}

// connWatch tells a run that nats.go gave its connection up.
type connWatch struct {
	nc      *nats.Conn
	once    sync.Once
	closing atomic.Bool // the run closes the connection itself
	gone    chan struct{}
}

func newConnWatch() *connWatch { return &connWatch{gone: make(chan struct{})} }

// watch sets nc's closed handler: a close the run did not ask for closes
// gone. Called right after the dial, before any part runs.
func (w *connWatch) watch(nc *nats.Conn) {
	w.nc = nc
	nc.SetClosedHandler(func(*nats.Conn) {
		if w.given() {
			w.once.Do(func() { close(w.gone) })
		}
	})
}

func (w *connWatch) lost() <-chan struct{} { return w.gone }

// given reports whether nats.go gave the connection up: closed with an
// error, and not by the run. (Closed without an error is a Close call: the
// process ending it, as a kill would; the run then ends.) nats.go marks a
// connection closed, with its error, before it ends its subscriptions, so a
// part that stops because of it sees this true.
func (w *connWatch) given() bool {
	return w != nil && w.nc != nil && w.nc.IsClosed() && w.nc.LastError() != nil && !w.closing.Load()
}

// close closes the connection on the run's behalf (draining it first).
func (w *connWatch) close() {
	if w.nc != nil {
		w.closing.Store(true)
		drain(w.nc)
	}
}

// keeper runs a program's runs one after the other: it is the part of the
// program's own life that holds the current run. It ends the program when a
// run ends for any other reason than a lost connection.
type keeper struct {
	name string
	log  *slog.Logger
	// next starts a new run; it retries nothing itself.
	next     func(ctx context.Context) (run, error)
	restarts prometheus.Counter

	renewc chan struct{} // renew's signal

	mu        sync.Mutex
	cur       run
	onRestart func()         // called after a new run replaced the old one (setOnRestart)
	old       sync.WaitGroup // old runs being closed
}

// setOnRestart makes f be called after every new run replaced an old one.
func (k *keeper) setOnRestart(f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onRestart = f
}

func newKeeper(name string, log *slog.Logger, next func(ctx context.Context) (run, error)) *keeper {
	return &keeper{name: name, log: log, next: next, renewc: make(chan struct{}, 1), restarts: prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "tokenbus_nats_connection_restarts_total",
		Help:        "Times a program started again on a new NATS connection because nats.go gave the old one up (the server closed it for a protocol error).",
		ConstLabels: prometheus.Labels{"program": name},
	})}
}

// current is the run now serving.
func (k *keeper) current() run {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cur
}

// keep runs first, and the runs after it, until ctx ends (then it closes the
// current run and returns nil) or a run ends for another reason than a lost
// connection (then it returns that run's error). first is current from the
// call on.
func (k *keeper) keep(ctx context.Context, first run) func() error {
	k.mu.Lock()
	k.cur = first
	k.mu.Unlock()
	return func() error { return k.loop(ctx, first) }
}

func (k *keeper) loop(ctx context.Context, first run) error {
	defer k.old.Wait()
	cur := first
	for {
		select {
		case <-ctx.Done():
			return cur.Close()
		case <-cur.Done():
			if err := cur.Wait(); err != nil || ctx.Err() != nil {
				return err
			}
			return errStopped
		case <-cur.lost():
			k.log.Error("NATS gave the connection up (the server closed it); starting again on a new connection",
				"program", k.name, "err", lastError(cur.conn()))
		case <-k.renewc:
			k.log.Warn("starting again: a program it runs on started again", "program", k.name)
		}
		next, err := k.start(ctx)
		if err != nil { // ctx ended while NATS could not be reached
			return cur.Close()
		}
		k.mu.Lock()
		k.cur = next
		onRestart := k.onRestart
		k.mu.Unlock()
		k.restarts.Inc()
		k.log.Info("running again", "program", k.name)
		if onRestart != nil {
			onRestart()
		}
		old := cur
		k.old.Add(1)
		go func() { defer k.old.Done(); _ = old.Close() }() // its streams end within its shutdown timeout
		cur = next
	}
}

// renew makes the keeper start a new run and close the current one, as
// when the connection is lost (dev's gateway runs on dev's dispatcher: when
// that starts again, so does the gateway).
func (k *keeper) renew() {
	select {
	case k.renewc <- struct{}{}:
	default:
	}
}

// start starts the next run, retrying (NATS may refuse us for a while:
// credentials being rotated, a server restarting) until it serves or ctx
// ends.
func (k *keeper) start(ctx context.Context) (run, error) {
	wait := 250 * time.Millisecond
	for {
		r, err := k.next(ctx)
		if err == nil {
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		k.log.Warn("could not start again yet; retrying", "program", k.name, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func lastError(nc *nats.Conn) error {
	if nc == nil {
		return nil
	}
	return nc.LastError()
}

// keptListener is a listener of the process that each run serves through a
// view of its own: a run's server closing its view (as fasthttp and
// net/http do at shutdown) leaves the socket open for the next run. While
// two runs overlap, either may take a connection.
type keptListener struct {
	ln    net.Listener
	conns chan net.Conn
	once  sync.Once
	done  chan struct{} // closed when the socket is closed
}

func keep(ln net.Listener) *keptListener {
	return &keptListener{ln: ln, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (k *keptListener) accept() {
	defer close(k.done)
	for {
		c, err := k.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case k.conns <- c:
		case <-k.done: // never: done closes only here
		}
	}
}

// view is a listener for one run.
func (k *keptListener) view() net.Listener {
	k.once.Do(func() { go k.accept() })
	return &listenerView{k: k, closed: make(chan struct{})}
}

// Close closes the socket: every view's Accept then fails.
func (k *keptListener) Close() error { return k.ln.Close() }

func (k *keptListener) Addr() net.Addr { return k.ln.Addr() }

type listenerView struct {
	k      *keptListener
	once   sync.Once
	closed chan struct{}
}

func (v *listenerView) Accept() (net.Conn, error) {
	select {
	case c := <-v.k.conns:
		return c, nil
	case <-v.closed:
		return nil, net.ErrClosed
	case <-v.k.done:
		return nil, net.ErrClosed
	}
}

func (v *listenerView) Close() error {
	v.once.Do(func() { close(v.closed) })
	return nil
}

func (v *listenerView) Addr() net.Addr { return v.k.ln.Addr() }

// gatherers is what a process's /metrics shows: the registries of its
// programs' current runs, one per name, replaced when a run starts again
// (so a new run registers its metrics on a registry of its own, never twice
// on one).
type gatherers struct {
	mu   sync.Mutex
	regs map[string]prometheus.Gatherer
	keys []string // in the order first seen
}

func newGatherers() *gatherers { return &gatherers{regs: map[string]prometheus.Gatherer{}} }

// set makes g the gatherer of name.
func (s *gatherers) set(name string, g prometheus.Gatherer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.regs[name]; !ok {
		s.keys = append(s.keys, name)
	}
	s.regs[name] = g
}

// Gather merges every registry's metrics.
func (s *gatherers) Gather() ([]*dto.MetricFamily, error) {
	s.mu.Lock()
	gs := make(prometheus.Gatherers, 0, len(s.keys))
	for _, k := range s.keys {
		gs = append(gs, s.regs[k])
	}
	s.mu.Unlock()
	return gs.Gather()
}
