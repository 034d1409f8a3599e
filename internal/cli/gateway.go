package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/gateway"
	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
)

type gatewayOptions struct {
	http            string
	bodyLimit       int
	requestTimeout  time.Duration
	shutdownTimeout time.Duration
}

func (o *gatewayOptions) register(fs *pflag.FlagSet, defaultHTTP string) {
	fs.StringVar(&o.http, "http", defaultHTTP, "listen address of the OpenAI-compatible HTTP API")
	fs.IntVar(&o.bodyLimit, "body-limit", 8<<20, "largest request body in bytes (also capped by the NATS server's max_payload); past it: 413")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 10*time.Minute, "longest a request may take end to end")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long open streams may go on")
}

// gatewayDeps is what a gateway runs on.
type gatewayDeps struct {
	nc    *nats.Conn
	cache *registry.Cache // may be nil
	reg   *prometheus.Registry
	log   *slog.Logger
}

// startGateway starts the gateway on its own listener; it returns the bound
// address and a stop function that shuts it down within o.shutdownTimeout.
func startGateway(ctx context.Context, o gatewayOptions, deps gatewayDeps) (string, func(), error) {
	table := dispatcher.NewTable()
	if err := dispatcher.Watch(ctx, deps.nc, table); err != nil {
		return "", nil, err
	}
	cl, err := client.New(deps.nc, client.Options{Logger: deps.log})
	if err != nil {
		return "", nil, err
	}
	limit := o.bodyLimit
	if mp := int(deps.nc.MaxPayload()) - 16<<10; mp > 0 && mp < limit {
		limit = mp // headers need room too
	}
	g := gateway.New(gateway.Config{
		BodyLimit:       limit,
		RequestTimeout:  o.requestTimeout,
		ShutdownTimeout: o.shutdownTimeout,
		Version:         Version,
	}, cl, &dispatcher.Catalog{Table: table, Registry: deps.cache}, deps.nc, deps.reg, deps.log)
	ln, err := net.Listen("tcp", o.http)
	if err != nil {
		return "", nil, fmt.Errorf("gateway listen: %w", err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(ln) }()
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
		defer cancel()
		if err := g.Shutdown(sctx); err != nil {
			deps.log.Warn("gateway shutdown", "err", err)
		}
		_ = cl.Close()
	}
	return ln.Addr().String(), stop, nil
}

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("gateway")
	var nopts natsconn.Options
	var gopts gatewayOptions
	var lopts logOptions
	var topts traceOptions
	gopts.register(fs, ":8080")
	nopts.Register(fs)
	redisURL := fs.String("redis-url", "redis://127.0.0.1:6379/0", "Redis holding the model registry (empty: none)")
	lopts.register(fs)
	topts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	log, err := lopts.logger(stderr, "gateway")
	if err != nil {
		return err
	}
	stopTracing, err := topts.setup(ctx, "tokenbus-gateway", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	nc, err := nopts.Connect("tokenbus-gateway", 30*time.Second, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	var cache *registry.Cache
	if *redisURL != "" {
		store, err := registry.Open(ctx, *redisURL)
		if err != nil {
			return err
		}
		defer store.Close()
		cache = registry.NewCache(store, log)
		_ = cache.Refresh(ctx)
		go cache.Run(ctx, nc, 10*time.Second)
	}
	addr, stop, err := startGateway(ctx, gopts, gatewayDeps{nc: nc, cache: cache, reg: newRegistry(), log: log})
	if err != nil {
		return err
	}
	log.Info("gateway listening", "http", "http://"+addr)
	<-ctx.Done()
	stop()
	return nc.Drain()
}
