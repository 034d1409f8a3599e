package cli

import (
	"context"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers"
)

type workerOptions struct {
	id             string
	maxConcurrency int
	drainTimeout   time.Duration
}

func (o *workerOptions) config(id string, reg prometheus.Registerer) workers.Config {
	if o.id != "" {
		id = o.id
	}
	return workers.Config{ID: id, MaxConcurrency: o.maxConcurrency, DrainTimeout: o.drainTimeout, Version: Version, Metrics: reg}
}

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("worker")
	var nopts natsconn.Options
	var eopts engineOptions
	var wopts workerOptions
	var popts processOptions
	nopts.Register(fs)
	fs.StringVar(&wopts.id, "id", "", "worker id, unique in the cluster (default: host name + random suffix)")
	fs.IntVar(&wopts.maxConcurrency, "max-concurrency", 256, "hard cap on requests in flight; past it the worker hands requests back")
	fs.DurationVar(&wopts.drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may run before they are cancelled")
	redisURL := fs.String("redis-url", "", "Redis holding the model registry; when set the worker registers its models there")
	metricsAddr := fs.String("metrics", "", "listen address for /metrics (empty: off)")
	eopts.register(fs)
	popts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	log, stop, err := popts.start(ctx, stderr, "worker")
	if err != nil {
		return err
	}
	defer stop()
	eng, err := eopts.newEngine(ctx, log)
	if err != nil {
		return err
	}
	defer eng.Close()
	if nopts.Inbox == "" {
		// Its own inbox namespace: NATS permissions let workers read their
		// replies (the start-up ping) without reading any client's inbox.
		nopts.Inbox = schemas.WorkerInboxPrefix
	}
	nc, err := nopts.Connect(ctx, "tokenbus-worker", 30*time.Second, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	if *redisURL != "" {
		if err := registerModels(ctx, *redisURL, eng.Models(), nc); err != nil {
			log.Warn("could not register models in Redis; serving anyway", "err", err)
		}
	}
	reg := newRegistry()
	if *metricsAddr != "" {
		stopMetrics, err := serveMetrics(*metricsAddr, reg)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	w, err := workers.New(wopts.config(hostID("worker")+"-"+nuid.Next()[:6], reg), nc, eng, log)
	if err != nil {
		return err
	}
	if err := w.Run(ctx); err != nil {
		return err
	}
	natsconn.Drain(nc, 5*time.Second)
	return nil
}

// registerModels records the models a worker serves, so that they stay known
// (503, not 404) while no worker is up.
func registerModels(ctx context.Context, url string, models []string, nc *nats.Conn) error {
	store, err := registry.Open(ctx, url)
	if err != nil {
		return err
	}
	defer store.Close()
	return ensureModels(ctx, store, models, nc)
}

func ensureModels(ctx context.Context, store *registry.Store, models []string, nc *nats.Conn) error {
	for _, m := range models {
		created, err := store.EnsureModel(ctx, registry.Model{Name: m, OwnedBy: "tokenbus"})
		if err != nil {
			return err
		}
		if created {
			_ = registry.Announce(nc, m)
		}
	}
	return nil
}
