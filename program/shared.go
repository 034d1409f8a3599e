package program

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// host is what a program gets from the process it runs in. A program started
// on its own (StartGateway...) gets the zero host: it dials NATS by URL and
// opens what its config names. Dev starts its programs on a host that
// connects them in-process and shares its store, model cache and metrics
// registry; what a host lends, the program uses and does not close.
type host struct {
	dial  dialer          // nil: dialURL
	store *registry.Store // nil: open the config's Redis topology, if any
	cache *registry.Cache // with store: the shared, running model cache
	// metrics, in dev: the process's /metrics, which shows a registry of
	// each program's current run (registry(name)); nil: every run has a
	// registry of its own and serves it.
	metrics *gatherers
	// dispatcher, for a gateway: route in-process through this one (dev's),
	// whose fleet also answers /ready, /v1/models and the admin API.
	dispatcher func() *dispatcher.Dispatcher
	// engine, for a worker: drive this engine (dev builds its engines first,
	// to learn which models they serve); the worker closes it.
	engine engine.Engine
	// local, in dev: the workers and the gateway's client, which dev's
	// programs hand requests and reply frames to in memory.
	local *inProcess
}

func (h host) dialer() dialer {
	if h.dial == nil {
		return dialURL
	}
	return h.dial
}

// registry is a fresh registry for a run of the program name: in dev, one
// that the process's /metrics shows from now on instead of the program's
// previous run's; otherwise one with the Go runtime's and the process's
// collectors, which the run serves itself.
func (h host) registry(name string) *prometheus.Registry {
	if h.metrics != nil {
		reg := prometheus.NewRegistry()
		h.metrics.set(name, reg)
		return reg
	}
	return newRegistry()
}

// gatherer is what a run whose registry is reg serves on /metrics.
func (h host) gatherer(reg *prometheus.Registry) prometheus.Gatherer {
	if h.metrics != nil {
		return h.metrics
	}
	return reg
}

// shared reports whether the run is one of dev's programs (which share the
// process's connection metrics and usage publisher counts).
func (h host) shared() bool { return h.metrics != nil }

// newRegistry is a metrics registry with the Go runtime's and the process's
// collectors, as every program exposes.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// logger is log, or one that discards.
func logger(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}

// componentLog is log (see logger) for one component of a program: its lines
// carry component=name. A program names its components itself, once each,
// on the logger its config gives; so that logger carries no component (a JSON
// line with a key twice is rejected by Elasticsearch, and other stores keep
// one of the values).
func componentLog(log *slog.Logger, name string) *slog.Logger {
	return logger(log).With("component", name)
}
