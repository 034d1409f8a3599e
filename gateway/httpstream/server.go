package httpstream

import (
	"time"

	"github.com/tokenbus/tokenbus/internal/runners"
	"github.com/valyala/fasthttp"
)

// Config tunes a Server. Zero values take the defaults shown.
type Config struct {
	ProbeInterval time.Duration // how often a silent request's client is probed. Default 1s
	StuckTimeout  time.Duration // a client that takes no bytes while frames wait this long is cut. Default 30s
}

// cutGrace is how long writes may still take once a stream's context ended.
const cutGrace = time.Second

// Server streams on the connections of one fasthttp server.
type Server struct {
	srv  *fasthttp.Server
	cfg  Config
	idle handedBack
	// next serves handed-back connections on kept goroutines: the
	// hijacked connection's goroutine is new per request, and the next
	// request's handler would grow its stack again.
	next   *runners.Runners
	probes *prober // the watchers' probes
}

// New takes over the hijacked connections of srv: it sets
// srv.KeepHijackedConns (a stream's connection is closed or handed back by
// Run, not by fasthttp). Call it before srv serves.
func New(srv *fasthttp.Server, cfg Config) *Server {
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.StuckTimeout <= 0 {
		cfg.StuckTimeout = 30 * time.Second
	}
	s := &Server{srv: srv, cfg: cfg, next: runners.New(10 * time.Second), probes: newProber(cfg.ProbeInterval)}
	srv.KeepHijackedConns = true
	return s
}

// Drain stops keeping connections alive, for shutdown: streams begun after
// it end with their connection, and handed-back connections still waiting
// for a request are closed.
func (s *Server) Drain() { s.idle.closeAll() }

// IdleConns is the number of handed-back connections waiting for a request.
func (s *Server) IdleConns() int { return int(s.idle.n.Load()) }
