package program

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// WorkerConfig configures a worker program: one engine behind the bus.
type WorkerConfig struct {
	// NATS: an empty Inbox is schemas.WorkerInboxPrefix, the workers' own
	// namespace, so NATS permissions can let workers read their replies (the
	// start-up ping) without reading any client's inbox.
	NATS    natsconn.Options
	Redis   registry.Topology // when configured, the worker registers its models there
	Metrics string            // listen address of /metrics; "" off
	// Worker: an empty ID is the host name and a random suffix; Version and
	// Metrics are set by the program.
	Worker  workers.Config
	Engine  EngineConfig
	Version string
	Log     *slog.Logger // gets the worker's lines, with component=worker (engine for its engine's): give it none of its own
}

// DefaultWorker is `tokenbus worker` with no flags.
func DefaultWorker() WorkerConfig {
	return WorkerConfig{
		NATS:   natsconn.Options{URL: nats.DefaultURL},
		Worker: workers.Config{MaxConcurrency: 256, DrainTimeout: 30 * time.Second, SwitchHold: 30 * time.Second},
		Engine: DefaultEngine(),
	}
}

// Worker is a running worker program. Its engine and /metrics listener are
// the process's; its parts run in a workerRun on one NATS connection,
// started again on a new one if nats.go gives that up (rerun.go), with the
// same id and engine.
type Worker struct {
	*life
	cfg     WorkerConfig
	eng     engine.Engine
	metrics *metricsServer
	k       *keeper
}

// workerRun is a worker's parts on one NATS connection.
type workerRun struct {
	*life
	cfg   WorkerConfig
	watch *connWatch
	eng   engine.Engine // lent by the Worker
	nc    *nats.Conn
	w     *workers.Worker

	stopUsage func() // flushes the usage publisher; nil before it started
}

// StartWorker starts a worker: it builds the engine (waiting for an HTTP
// engine's first good health check, within Engine.StartTimeout), connects to
// NATS (retrying for 30s) and returns once the worker takes requests. A
// worker whose id is already in use fails here.
func StartWorker(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	return startWorker(ctx, cfg, host{})
}

func startWorker(ctx context.Context, cfg WorkerConfig, h host) (*Worker, error) {
	p := &Worker{life: newLife(), cfg: cfg, eng: h.engine}
	err := p.start(ctx, h)
	if err := p.begin(err, p.metrics.shutdown, p.release); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Worker) start(ctx context.Context, h host) error {
	var err error
	if p.eng == nil {
		p.cfg.Engine.SleepMode = p.cfg.Worker.SleepAfter > 0
		p.cfg.Engine.KVTransfer = p.cfg.Worker.Role != schemas.RoleBoth
		if p.eng, err = newEngine(ctx, p.cfg.Engine, componentLog(p.cfg.Log, "engine")); err != nil {
			p.eng = nil // newEngine closed it
			return err
		}
	}
	if p.cfg.Worker.ID == "" { // one id for every run
		p.cfg.Worker.ID = hostID("worker") + "-" + nuid.Next()[:6]
	}
	if p.metrics, err = listenMetrics(p.cfg.Metrics); err != nil {
		return err
	}
	if p.metrics != nil {
		p.part("metrics", p.metrics.serve)
	}
	p.k = newKeeper(p.cfg.Worker.ID, componentLog(p.cfg.Log, "worker"), func(ctx context.Context) (run, error) {
		return startWorkerRun(ctx, p.cfg, h, p.eng, p.metrics, p.k.restarts)
	})
	first, err := startWorkerRun(ctx, p.cfg, h, p.eng, p.metrics, p.k.restarts)
	if err != nil {
		return err
	}
	p.part("worker", p.k.keep(p.ctx, first))
	return nil
}

// release closes the engine once the last run has ended.
func (p *Worker) release() {
	if p.eng != nil {
		p.eng.Close()
	}
}

// run is the worker's current run.
func (p *Worker) run() *workerRun { return p.k.current().(*workerRun) }

// Addr is the bound address of /metrics, "" when it is off.
func (p *Worker) Addr() string { return p.metrics.addr() }

// ID is the worker's id.
func (p *Worker) ID() string { return p.cfg.Worker.ID }

// Models are the models the worker's engine serves.
func (p *Worker) Models() []string { return p.eng.Models() }

func startWorkerRun(ctx context.Context, cfg WorkerConfig, h host, eng engine.Engine, ms *metricsServer, restarts prometheus.Counter) (*workerRun, error) {
	p := &workerRun{life: newLife(), cfg: cfg, eng: eng, watch: newConnWatch()}
	p.life.conn = p.watch
	err := p.start(ctx, h, ms, restarts)
	if err := p.begin(err, func() {}, p.release); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *workerRun) lost() <-chan struct{} { return p.watch.lost() }
func (p *workerRun) conn() *nats.Conn      { return p.nc }

func (p *workerRun) start(ctx context.Context, h host, ms *metricsServer, restarts prometheus.Counter) error {
	cfg, log := p.cfg, componentLog(p.cfg.Log, "worker")
	var err error
	if cfg.NATS.Inbox == "" {
		cfg.NATS.Inbox = schemas.WorkerInboxPrefix
	}
	if p.nc, err = h.dialer()(ctx, cfg.NATS, "tokenbus-worker", log); err != nil {
		return err
	}
	p.watch.watch(p.nc)
	if cfg.Redis.Configured() {
		if err := registerModels(ctx, cfg.Redis, servable(p.eng), p.nc); err != nil {
			log.Warn("could not register models in Redis; serving anyway", "err", err)
		}
	}
	wcfg := cfg.Worker
	reg := h.registry(wcfg.ID)
	reg.MustRegister(restarts)
	if !h.shared() {
		registerConnMetrics(reg, p.nc, nil)
	}
	ms.show(reg)
	wcfg.Version, wcfg.Metrics = cfg.Version, reg
	if h.local != nil {
		wcfg.Local = h.local
	}
	if wcfg.Usage == nil {
		var ureg prometheus.Registerer
		if !h.shared() { // in dev, the gateway's publisher counts
			ureg = reg
		}
		if wcfg.Usage, err = p.startWorkerUsage(wcfg.ID, ureg, log); err != nil {
			return err
		}
	}
	if p.w, err = workers.New(wcfg, p.nc, p.eng, log); err != nil {
		return err
	}
	if h.local != nil {
		h.local.addWorker(wcfg.ID, p.w)
	}
	p.part("worker", func() error { return p.w.Run(p.ctx) })
	return p.waitReady(ctx, p.w.Ready(), "the worker")
}

// release drains the connection once the worker has drained its requests
// (the engine is the Worker's).
func (p *workerRun) release() {
	if p.stopUsage != nil {
		p.stopUsage()
	}
	p.watch.close()
}

// hostID is the host name as a subject token, prefix if it has none.
func hostID(prefix string) string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = prefix
	}
	return schemas.SafeToken(h)
}
