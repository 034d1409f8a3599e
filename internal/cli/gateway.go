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

	"github.com/tokenbus/tokenbus/admin"
	"github.com/tokenbus/tokenbus/auth"
	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/fleet"
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
	auth            bool
	keyCacheTTL     time.Duration
	admin           string
	adminToken      string
}

// register defines the gateway's flags; defaultAuth is --auth's default (on
// for `gateway`, off for `dev`).
func (o *gatewayOptions) register(fs *pflag.FlagSet, defaultHTTP string, defaultAuth bool) {
	fs.StringVar(&o.http, "http", defaultHTTP, "listen address of the OpenAI-compatible HTTP API")
	fs.IntVar(&o.bodyLimit, "body-limit", 8<<20, "largest request body in bytes (also capped by the NATS server's max_payload); past it: 413")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 10*time.Minute, "longest a request may take end to end")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long open streams may go on")
	fs.BoolVar(&o.auth, "auth", defaultAuth, "require API keys (Authorization: Bearer tb-...; create them with POST /keys on the admin API) and enforce their model lists and rate limits")
	fs.DurationVar(&o.keyCacheTTL, "key-cache-ttl", 10*time.Second, "how long a gateway trusts an API key lookup before asking Redis again (deletions apply at once through an event)")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:8081", `listen address of the admin API (models, adapters, workers, keys, usage); "" turns it off`)
	fs.StringVar(&o.adminToken, "admin-token", "", "bearer token the admin API requires (prefer the environment variable to the command line)")
}

// check reports flags that do not go together.
func (o *gatewayOptions) check(haveRedis bool) error {
	switch {
	case o.auth && !haveRedis:
		return fmt.Errorf("--auth needs Redis (--redis-url): API keys live there; or run without keys: --auth=false")
	case o.admin != "" && !haveRedis:
		return fmt.Errorf(`the admin API needs Redis (--redis-url); or turn it off with --admin ""`)
	case o.admin != "" && o.adminToken == "":
		return fmt.Errorf(`--admin-token (or %s) is required for the admin API on %s; or turn it off with --admin ""`,
			flagenv.EnvName("admin-token"), o.admin)
	}
	return nil
}

// gatewayDeps is what a gateway runs on.
type gatewayDeps struct {
	nc *nats.Conn
	// dispatcher, when set, routes the gateway's requests in-process (its
	// fleet also answers /ready, /v1/models and the admin API's /workers).
	dispatcher *dispatcher.Dispatcher
	store      *registry.Store // may be nil: no keys, usage or admin API
	cache      *registry.Cache // may be nil
	reg        *prometheus.Registry
	log        *slog.Logger
}

// runningGateway is a started gateway and, if configured, its admin API.
type runningGateway struct {
	addr      string // the OpenAI API's bound address
	adminAddr string // "" when the admin API is off
	stop      func() // shuts both down within shutdownTimeout
}

// startGateway starts the gateway on its own listener, with API keys when
// o.auth, usage counting when there is a store, and the admin API on o.admin.
func startGateway(ctx context.Context, o gatewayOptions, deps gatewayDeps) (*runningGateway, error) {
	copts := client.Options{Logger: deps.log}
	var workers *fleet.Fleet
	if deps.dispatcher != nil {
		workers = deps.dispatcher.Fleet()
		copts.Submit = deps.dispatcher.Submit
	} else {
		workers = fleet.New()
		if err := fleet.Watch(ctx, deps.nc, workers); err != nil {
			return nil, err
		}
	}
	cl, err := client.New(deps.nc, copts)
	if err != nil {
		return nil, err
	}
	limit := o.bodyLimit
	if mp := int(deps.nc.MaxPayload()) - 16<<10; mp > 0 && mp < limit {
		limit = mp // headers need room too
	}
	cfg := gateway.Config{
		BodyLimit:       limit,
		RequestTimeout:  o.requestTimeout,
		ShutdownTimeout: o.shutdownTimeout,
		Version:         Version,
	}
	var au *auth.Auth
	if deps.store != nil {
		acfg := auth.Config{Limiter: registry.NewLimiter(deps.store), Log: deps.log, Metrics: deps.reg}
		if o.auth {
			acfg.Keys = registry.NewKeyCache(deps.store, o.keyCacheTTL, deps.log)
			unsub, err := acfg.Keys.Subscribe(deps.nc)
			if err != nil {
				return nil, err
			}
			context.AfterFunc(ctx, unsub)
		}
		au = auth.New(acfg)
		cfg.OnUsage = au.OnUsage
		if o.auth {
			cfg.Authorize = au.Authorize
		}
	}
	var models gateway.Registry
	if deps.cache != nil {
		models = deps.cache
	}
	g := gateway.New(cfg, cl, gateway.NewCatalog(workers, models), deps.nc, deps.reg, deps.log)

	var adm *admin.Server
	var admLn net.Listener
	if o.admin != "" {
		if adm, err = admin.New(admin.Config{Token: o.adminToken, Store: deps.store, NC: deps.nc, Fleet: workers,
			Log: deps.log.With("component", "admin")}); err != nil {
			return nil, err
		}
		if admLn, err = net.Listen("tcp", o.admin); err != nil {
			return nil, fmt.Errorf("admin listen: %w", err)
		}
		go adm.Serve(admLn)
	}
	ln, err := net.Listen("tcp", o.http)
	if err != nil {
		if admLn != nil {
			_ = adm.Shutdown(context.Background())
		}
		return nil, fmt.Errorf("gateway listen: %w", err)
	}
	go g.Serve(ln)
	rg := &runningGateway{addr: ln.Addr().String()}
	if admLn != nil {
		rg.adminAddr = admLn.Addr().String()
	}
	rg.stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
		defer cancel()
		if adm != nil {
			_ = adm.Shutdown(sctx)
		}
		if err := g.Shutdown(sctx); err != nil {
			deps.log.Warn("gateway shutdown", "err", err)
		}
		if au != nil {
			_ = au.Wait(sctx) // usage of the last requests
		}
		_ = cl.Close()
	}
	return rg, nil
}

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("gateway")
	var nopts natsconn.Options
	var gopts gatewayOptions
	var popts processOptions
	var dopts dispatcherOptions
	gopts.register(fs, ":8080", true)
	embed := fs.Bool("embed-dispatcher", true, "route requests with a dispatcher inside the gateway, straight to workers (saves two NATS hops before the first token); standalone dispatchers still serve NATS-native clients")
	dopts.register(fs)
	nopts.Register(fs)
	redisURL := fs.String("redis-url", "redis://127.0.0.1:6379/0", "Redis holding the registry, API keys, limits and usage (empty: none; then --auth=false --admin '' are needed)")
	popts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := gopts.check(*redisURL != ""); err != nil {
		return err
	}
	log, stop, err := popts.start(ctx, stderr, "gateway")
	if err != nil {
		return err
	}
	defer stop()
	nc, err := nopts.Connect(ctx, "tokenbus-gateway", 30*time.Second, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	var cache *registry.Cache
	var store *registry.Store
	if *redisURL != "" {
		store, err = registry.Open(ctx, *redisURL)
		if err != nil {
			return err
		}
		defer store.Close()
		cache = registry.NewCache(store, log)
		_ = cache.Refresh(ctx)
		go cache.Run(ctx, nc, 10*time.Second)
	}
	reg := newRegistry()
	deps := gatewayDeps{nc: nc, store: store, cache: cache, reg: reg, log: log}
	dctx, stopDispatcher := context.WithCancel(context.Background())
	defer stopDispatcher()
	dispatcherDone := make(chan struct{})
	if *embed {
		var models dispatcher.Registry
		if cache != nil {
			models = cache
		}
		cfg := dopts.config()
		cfg.Embedded = true
		d := dispatcher.New(cfg, nc, models, reg, log.With("component", "dispatcher"))
		go func() {
			defer close(dispatcherDone)
			if err := d.Run(dctx); err != nil {
				log.Error("embedded dispatcher stopped", "err", err)
			}
		}()
		if err := waitReady(ctx, d.Ready()); err != nil {
			return err
		}
		deps.dispatcher = d
	} else {
		close(dispatcherDone)
	}
	gw, err := startGateway(ctx, gopts, deps)
	if err != nil {
		return err
	}
	log.Info("gateway listening", "http", "http://"+gw.addr, "auth", gopts.auth, "admin", gw.adminAddr, "embedded_dispatcher", *embed)
	<-ctx.Done()
	gw.stop()
	stopDispatcher()
	<-dispatcherDone
	natsconn.Drain(nc, 5*time.Second)
	return nil
}
