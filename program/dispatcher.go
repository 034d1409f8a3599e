package program

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
)

// DispatcherConfig configures a standalone dispatcher program: it serves the
// request subjects in the dispatchers' queue group, for NATS-native clients
// and gateways without an embedded dispatcher.
type DispatcherConfig struct {
	NATS       natsconn.Options
	Redis      registry.Topology // the model registry; none configured: none (unknown models then get 404)
	Metrics    string            // listen address of /metrics; "" off
	Dispatcher dispatcher.Config
	Limits     LimitsConfig // tenant requests' admission: the Redis breaker, fail open or closed, reservations
	Log        *slog.Logger // gets the dispatcher's lines, with component=dispatcher: give it none of its own
}

// DefaultDispatcher is `tokenbus dispatcher` with no flags.
func DefaultDispatcher() DispatcherConfig {
	return DispatcherConfig{
		NATS:       natsconn.Options{URL: nats.DefaultURL},
		Redis:      registry.Topology{URL: "redis://127.0.0.1:6379/0"},
		Dispatcher: DefaultDispatcherConfig(),
		Limits:     DefaultLimits(),
	}
}

// Dispatcher is a running dispatcher program. Its /metrics listener is the
// process's; its parts run in a dispatcherRun on one NATS connection,
// started again on a new one if nats.go gives that up (rerun.go).
type Dispatcher struct {
	*life
	cfg     DispatcherConfig
	metrics *metricsServer
	k       *keeper
}

// StartDispatcher starts a dispatcher: it connects to NATS (retrying for
// 30s) and Redis and returns once the dispatcher takes requests.
func StartDispatcher(ctx context.Context, cfg DispatcherConfig) (*Dispatcher, error) {
	return startDispatcher(ctx, cfg, host{})
}

func startDispatcher(ctx context.Context, cfg DispatcherConfig, h host) (*Dispatcher, error) {
	p := &Dispatcher{life: newLife(), cfg: cfg}
	err := p.start(ctx, h)
	if err := p.begin(err, p.metrics.shutdown, func() {}); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Dispatcher) start(ctx context.Context, h host) error {
	var err error
	if p.metrics, err = listenMetrics(p.cfg.Metrics); err != nil {
		return err
	}
	if p.metrics != nil {
		p.part("metrics", p.metrics.serve)
	}
	p.k = newKeeper("dispatcher", componentLog(p.cfg.Log, "dispatcher"), func(ctx context.Context) (run, error) {
		return startDispatcherRun(ctx, p.cfg, h, p.metrics, p.k.restarts)
	})
	first, err := startDispatcherRun(ctx, p.cfg, h, p.metrics, p.k.restarts)
	if err != nil {
		return err
	}
	p.part("dispatcher", p.k.keep(p.ctx, first))
	return nil
}

// run is the dispatcher's current run.
func (p *Dispatcher) run() *dispatcherRun { return p.k.current().(*dispatcherRun) }

// Addr is the bound address of /metrics, "" when it is off.
func (p *Dispatcher) Addr() string { return p.metrics.addr() }

// ID is the dispatcher's id (its current run's: a new run is a new dispatcher).
func (p *Dispatcher) ID() string { return p.run().d.ID() }

// dispatcherRun is a dispatcher's parts on one NATS connection.
type dispatcherRun struct {
	*life
	cfg   DispatcherConfig
	watch *connWatch
	nc    *nats.Conn
	store *registry.Store // ours to close; nil when lent or absent
	d     *dispatcher.Dispatcher
}

func startDispatcherRun(ctx context.Context, cfg DispatcherConfig, h host, ms *metricsServer, restarts prometheus.Counter) (*dispatcherRun, error) {
	p := &dispatcherRun{life: newLife(), cfg: cfg, watch: newConnWatch()}
	p.life.conn = p.watch
	err := p.start(ctx, h, ms, restarts)
	if err := p.begin(err, func() {}, p.release); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *dispatcherRun) lost() <-chan struct{} { return p.watch.lost() }
func (p *dispatcherRun) conn() *nats.Conn      { return p.nc }

func (p *dispatcherRun) start(ctx context.Context, h host, ms *metricsServer, restarts prometheus.Counter) error {
	log := componentLog(p.cfg.Log, "dispatcher")
	var err error
	if p.nc, err = h.dialer()(ctx, p.cfg.NATS, "tokenbus-dispatcher", log); err != nil {
		return err
	}
	p.watch.watch(p.nc)
	var models dispatcher.Registry
	cache := h.cache
	if cache == nil && p.cfg.Redis.Configured() {
		if p.store, err = registry.OpenTopology(ctx, p.cfg.Redis); err != nil {
			return err
		}
		cache = registry.NewCache(p.store, log)
		// Read once now: the per-model gauges list the registered models
		// from the first scrape.
		_ = cache.Refresh(ctx)
		p.part("registry cache", func() error { cache.Run(p.ctx, p.nc, 10*time.Second); return nil })
	}
	if cache != nil {
		models = cache
	}
	reg := h.registry("dispatcher")
	reg.MustRegister(restarts)
	if !h.shared() {
		registerConnMetrics(reg, p.nc, cache)
	}
	ms.show(reg)
	dcfg := p.cfg.Dispatcher
	if h.local != nil {
		dcfg.Local = h.local
	}
	if store := h.store; store != nil || p.store != nil {
		if store == nil {
			store = p.store
		}
		// Tenant requests (tokenbus.v1.treq.<key-id>.<model>): their keys
		// and limits are the registry's.
		if dcfg.Admit == nil {
			dcfg.Admit = tenantAdmitter(store, cache, p.cfg.Limits, reg, log) // sets the store's breaker
		}
		if dcfg.Keys == nil {
			// Cached as a gateway caches keys: no Redis round trip per
			// request, emptied by every keys event (a deleted key stops at once).
			keys := registry.NewKeyCache(store, 0, log)
			keys.MaxStale = p.cfg.Limits.KeyMaxStale
			if _, err := keys.Subscribe(p.nc); err != nil { // ends with the connection
				return err
			}
			dcfg.Keys = keys
		}
	}
	p.d = dispatcher.New(dcfg, p.nc, models, reg, log)
	p.part("dispatcher", func() error { return p.d.Run(p.ctx) })
	return p.waitReady(ctx, p.d.Ready(), "the dispatcher")
}

func (p *dispatcherRun) release() {
	p.watch.close()
	if p.store != nil {
		_ = p.store.Close()
	}
}
