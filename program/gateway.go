package program

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/admin"
	"github.com/tokenbus/tokenbus/auth"
	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/gateway"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/usage"
)

// HTTPConfig is a gateway's HTTP side: the OpenAI-compatible API and the
// admin API. Gateway and dev share it.
type HTTPConfig struct {
	Listen         string        // the OpenAI API's listen address
	BodyLimit      int           // largest request body in bytes (also capped by the NATS server's max_payload); past it 413
	RequestTimeout time.Duration // longest a request may take end to end
	HoldKeepalive  time.Duration // gateway.Config.HoldKeepalive: SSE comments while a stream waits for capacity
	// ReadyWithoutWorkers: /ready needs NATS only (gateway.Config), for
	// worker pools scaled to zero.
	ReadyWithoutWorkers bool
	ShutdownTimeout     time.Duration // on Close, how long open streams may go on
	Auth                bool          // require API keys and enforce their model lists and rate limits (needs the store)
	FlowFromUser        bool          // without a key, a request's "user" field names its flow (gateway.Config.FlowFromUser)
	KeyCacheTTL         time.Duration // how long an API key lookup is trusted
	Admin               string        // the admin API's listen address; "" turns it off (on: needs the store and AdminToken)
	AdminToken          string        // the bearer token the admin API requires
	// AuthFailures: failed API key (or admin token) checks within a minute
	// from one client address, or with one key prefix, before 429s with
	// Retry-After, doubling up to 15 minutes (gateway/throttle.go).
	AuthFailures int
	// TrustedProxies: comma-separated addresses and CIDR prefixes of reverse
	// proxies whose X-Forwarded-For names the client; "" trusts none (the
	// client is the TCP peer).
	TrustedProxies string
	Limits         LimitsConfig // Redis faults, reservations and usage
	// MigrationLimit: how many times a request whose worker fails (dies,
	// refuses, goes silent, loses a frame) is sent to another worker: a
	// retry before its first token, a migration after it (client.Options).
	// 0 turns it off.
	MigrationLimit int
	// MigrationMaxSeqLen: chunks a stream keeps to be continued elsewhere;
	// a longer stream that loses its worker fails with stream_lost.
	MigrationMaxSeqLen int
	// CORS: which browser pages of other origins may call the OpenAI API
	// (vLLM's defaults: any origin, method and header, no credentials).
	CORS gateway.CORSConfig
	// Batch: the Files and Batches APIs and the batch runner.
	Batch BatchConfig
	// Responses: the bounds of the Responses API's state and runner.
	Responses ResponsesConfig
	// Quotas are the default quotas of a tenant (0: no limit); a tenant's
	// own (the admin API's PUT /tenants/{tenant}/quotas) override them.
	Quotas registry.Quotas
	// QuotaCacheTTL: how long a tenant's quotas are trusted before Redis is
	// asked again (changes apply at once through an event).
	QuotaCacheTTL time.Duration
}

// LimitsConfig is how a gateway keeps limits and usage through Redis faults.
type LimitsConfig struct {
	// Breaker bounds each Redis call on a request's path and opens after
	// repeated failures (registry.BreakerConfig: 50ms, 5, 1s by default).
	Breaker registry.BreakerConfig
	// FailClosed refuses (503) the requests of keys with limits while Redis
	// cannot check them; by default they are allowed.
	FailClosed bool
	// KeyMaxStale: while Redis is down, a key Redis confirmed within it keeps
	// working; other keys get 503. Default 1h.
	KeyMaxStale time.Duration
	// DefaultMaxTokens is reserved against TPM for a request without
	// max_tokens of a model with no registered max_model_len. Default 4096.
	DefaultMaxTokens int
	// UsageStream bounds the JetStream stream usage records wait in.
	UsageStream usage.StreamConfig
	// UsageBuffer bounds the records held in memory while JetStream cannot
	// take them (past it they are dropped and counted). Default 100000.
	UsageBuffer int
}

// DefaultLimits is LimitsConfig as `tokenbus gateway` has it.
func DefaultLimits() LimitsConfig {
	return LimitsConfig{
		Breaker:          registry.BreakerConfig{Timeout: 50 * time.Millisecond, Failures: 5, Cooldown: time.Second},
		KeyMaxStale:      time.Hour,
		DefaultMaxTokens: 4096,
		UsageStream:      usage.StreamConfig{MaxBytes: 1 << 30, MaxMsgs: 10_000_000, MaxAge: 7 * 24 * time.Hour},
		UsageBuffer:      100_000,
	}
}

// GatewayConfig configures a gateway program.
type GatewayConfig struct {
	NATS  natsconn.Options
	Redis registry.Topology // registry, API keys, limits and usage; none configured: no Redis (then Auth off and Admin "")
	HTTP  HTTPConfig
	// EmbedDispatcher routes requests with a dispatcher inside the gateway,
	// straight to workers; Dispatcher configures it (it runs Embedded).
	// Without it the gateway publishes to standalone dispatchers.
	EmbedDispatcher bool
	Dispatcher      dispatcher.Config
	Version         string
	// Log gets the gateway's lines, with component=gateway (dispatcher,
	// admin for the embedded dispatcher's and the admin API's): give it
	// none of its own.
	Log *slog.Logger
}

// DefaultHTTP is the gateway's HTTP side as `tokenbus gateway` has it.
func DefaultHTTP() HTTPConfig {
	return HTTPConfig{
		Listen:          ":8080",
		BodyLimit:       8 << 20,
		RequestTimeout:  10 * time.Minute,
		HoldKeepalive:   5 * time.Second,
		ShutdownTimeout: 10 * time.Second,
		Auth:            true,
		KeyCacheTTL:     10 * time.Second,
		Admin:           "127.0.0.1:8081",
		Limits:          DefaultLimits(),
		AuthFailures:    10,

		MigrationLimit:     3,
		MigrationMaxSeqLen: 4096,
		CORS:               gateway.CORSConfig{Origins: []string{"*"}, Methods: []string{"*"}, Headers: []string{"*"}},
		Batch:              DefaultBatch(),
		Responses:          DefaultResponses(),
		Quotas:             DefaultQuotas(),
		QuotaCacheTTL:      10 * time.Second,
	}
}

// DefaultQuotas is a tenant's quotas as `tokenbus gateway` and `tokenbus
// dev` have them: a quarter of the files bucket's default 1 GiB each, so
// that one tenant cannot fill it, 1,000 files and 100 batches not yet ended.
func DefaultQuotas() registry.Quotas {
	return registry.Quotas{FileBytes: 256 << 20, Files: 1000, Batches: 100}
}

// DefaultDispatcherConfig is a dispatcher's configuration as the tokenbus command
// has it.
func DefaultDispatcherConfig() dispatcher.Config {
	return dispatcher.Config{QueueSize: 1024, QueueTimeout: 60 * time.Second, ColdStartTimeout: 5 * time.Minute, ReplyPrefixes: []string{"_INBOX."},
		Disagg: dispatcher.DisaggConfig{MinPromptTokens: 1024}}
}

// DefaultGateway is `tokenbus gateway` with no flags.
func DefaultGateway() GatewayConfig {
	return GatewayConfig{
		NATS:            natsconn.Options{URL: nats.DefaultURL},
		Redis:           registry.Topology{URL: "redis://127.0.0.1:6379/0"},
		HTTP:            DefaultHTTP(),
		EmbedDispatcher: true,
		Dispatcher:      DefaultDispatcherConfig(),
	}
}

// check reports settings that do not go together.
func (c HTTPConfig) check(haveStore bool) error {
	switch {
	case c.Auth && !haveStore:
		return errors.New("API keys (Auth) need the store (a Redis URL)")
	case c.Admin != "" && !haveStore:
		return errors.New("the admin API needs the store (a Redis URL)")
	case c.Admin != "" && c.AdminToken == "":
		return errors.New("the admin API needs an admin token")
	}
	if _, err := gateway.ParseTrustedProxies(c.TrustedProxies); err != nil {
		return fmt.Errorf("trusted proxies: %w", err)
	}
	return c.CORS.Check()
}

// Gateway is a running gateway program: the OpenAI-compatible HTTP API, its
// admin API if configured, and its embedded dispatcher if configured. Its
// listeners are the process's; its parts run in a gatewayRun on one NATS
// connection, started again on a new one if nats.go gives that up
// (rerun.go).
type Gateway struct {
	*life
	cfg       GatewayConfig
	k         *keeper
	ln, admLn *keptListener
}

// StartGateway starts a gateway: it connects to NATS (retrying for 30s) and
// Redis, starts the embedded dispatcher, and serves once it takes requests.
func StartGateway(ctx context.Context, cfg GatewayConfig) (*Gateway, error) {
	return startGateway(ctx, cfg, host{})
}

func startGateway(ctx context.Context, cfg GatewayConfig, h host) (*Gateway, error) {
	g := &Gateway{life: newLife(), cfg: cfg}
	err := g.start(ctx, h)
	if err := g.begin(err, func() {}, g.release); err != nil {
		return nil, err
	}
	return g, nil
}

func (g *Gateway) start(ctx context.Context, h host) error {
	cfg := g.cfg
	if err := cfg.HTTP.check(h.store != nil || cfg.Redis.Configured()); err != nil {
		return err
	}
	// The OpenAI API's listener first: the console needs its address.
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("gateway listen: %w", err)
	}
	g.ln = keep(ln)
	if cfg.HTTP.Admin != "" {
		aln, err := net.Listen("tcp", cfg.HTTP.Admin)
		if err != nil {
			return fmt.Errorf("admin listen: %w", err)
		}
		g.admLn = keep(aln)
	}
	g.k = newKeeper("gateway", componentLog(cfg.Log, "gateway"), func(ctx context.Context) (run, error) {
		return startGatewayRun(ctx, cfg, h, g.ln, g.admLn, g.k.restarts)
	})
	first, err := startGatewayRun(ctx, cfg, h, g.ln, g.admLn, g.k.restarts)
	if err != nil {
		return err
	}
	g.part("gateway", g.k.keep(g.ctx, first))
	return nil
}

// release closes the listeners once the last run has ended.
func (g *Gateway) release() {
	if g.ln != nil {
		_ = g.ln.Close()
	}
	if g.admLn != nil {
		_ = g.admLn.Close()
	}
}

// run is the gateway's current run.
func (g *Gateway) run() *gatewayRun { return g.k.current().(*gatewayRun) }

// Addr is the OpenAI API's bound address (host:port).
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// AdminAddr is the admin API's bound address, "" when it is off.
func (g *Gateway) AdminAddr() string {
	if g.admLn == nil {
		return ""
	}
	return g.admLn.Addr().String()
}

// gatewayRun is a gateway's parts on one NATS connection.
type gatewayRun struct {
	*life
	cfg   GatewayConfig
	log   *slog.Logger
	watch *connWatch

	nc        *nats.Conn
	store     *registry.Store // ours to close; nil when lent or absent
	unsubKeys func()          // the API key cache's event subscription
	stopDisp  context.CancelFunc
	cl        *client.Client
	workers   *fleet.Fleet // the embedded dispatcher's, or one fleet.Watch keeps
	g         *gateway.Gateway
	au        *auth.Auth
	revoked   *registry.Revocations // nil without the store

	quotas      *registry.QuotaCache // tenants' quotas, for the stores that enforce them
	unsubQuotas func()               // its event subscription
	pub         *usage.Publisher
	stopUsage   context.CancelFunc // the usage publisher and consumer
	usageDone   chan struct{}      // closed when both returned
	adm         *admin.Server
	ln, admLn   net.Listener // views of the process's listeners
}

func startGatewayRun(ctx context.Context, cfg GatewayConfig, h host, ln, admLn *keptListener, restarts prometheus.Counter) (*gatewayRun, error) {
	gw := &gatewayRun{life: newLife(), cfg: cfg, log: componentLog(cfg.Log, "gateway"), watch: newConnWatch()}
	gw.life.conn = gw.watch
	err := gw.start(ctx, h, ln, admLn, restarts)
	if err := gw.begin(err, gw.shutdown, gw.release); err != nil {
		return nil, err
	}
	return gw, nil
}

func (gw *gatewayRun) lost() <-chan struct{} { return gw.watch.lost() }
func (gw *gatewayRun) conn() *nats.Conn      { return gw.nc }

func (gw *gatewayRun) start(ctx context.Context, h host, ln, admLn *keptListener, restarts prometheus.Counter) error {
	cfg, log := gw.cfg, gw.log
	var err error
	if gw.nc, err = h.dialer()(ctx, cfg.NATS, "tokenbus-gateway", log); err != nil {
		return err
	}
	gw.watch.watch(gw.nc)
	store, cache := h.store, h.cache
	if store == nil && cfg.Redis.Configured() {
		if store, err = registry.OpenTopology(ctx, cfg.Redis); err != nil {
			return err
		}
		if old, err := store.OldLayout(ctx); err == nil && old {
			log.Warn("Redis holds a registry in the layout before Redis Cluster support and none in today's: its API keys, models and usage are not seen; copy them with `tokenbus redis migrate` (docs/redis.md)",
				"redis", cfg.Redis.String())
		}
		if addr, have, err := store.ReplicasShort(ctx); err == nil && addr != "" {
			log.Warn("a Redis master has fewer replicas than --redis-min-replicas: usage records of the API keys it holds wait in JetStream, and API keys cannot be created, until it has them (docs/redis.md)",
				"master", addr, "replicas", have, "min_replicas", cfg.Redis.Replicas())
		}
		gw.store = store
		cache = registry.NewCache(store, log)
		_ = cache.Refresh(ctx)
		gw.part("registry cache", func() error { cache.Run(gw.ctx, gw.nc, 10*time.Second); return nil })
	}
	reg := h.registry("gateway")
	reg.MustRegister(restarts)
	if !h.shared() {
		registerConnMetrics(reg, gw.nc, cache)
	}

	var d *dispatcher.Dispatcher
	if h.dispatcher != nil {
		d = h.dispatcher()
	}
	if d == nil && cfg.EmbedDispatcher {
		var models dispatcher.Registry
		if cache != nil {
			models = cache
		}
		dcfg := cfg.Dispatcher
		dcfg.Embedded = true
		d = dispatcher.New(dcfg, gw.nc, models, reg, componentLog(cfg.Log, "dispatcher"))
		// Its own context: it routes until the gateway has stopped.
		dctx, stop := context.WithCancel(context.Background())
		gw.stopDisp = stop
		gw.part("embedded dispatcher", func() error { return d.Run(dctx) })
		if err := gw.waitReady(ctx, d.Ready(), "the embedded dispatcher"); err != nil {
			return err
		}
	}

	copts := client.Options{Logger: log, MigrationLimit: cfg.HTTP.MigrationLimit, MigrationMaxSeqLen: cfg.HTTP.MigrationMaxSeqLen,
		OnFailover: failoverMetrics(reg)}
	if copts.MigrationLimit <= 0 {
		copts.MigrationLimit = -1 // the flag's 0 is "off"; the client's 0 is its default
	}
	var workers *fleet.Fleet
	if d != nil {
		workers = d.Fleet()
		copts.Submit = d.Submit
	} else {
		workers = fleet.New()
		if err := fleet.Watch(gw.ctx, gw.nc, workers); err != nil {
			return err
		}
	}
	if gw.cl, err = client.New(gw.nc, copts); err != nil {
		return err
	}
	// A worker the fleet sees go (no heartbeat for 3 beats, or it shut
	// down) takes its streams with it at once, not after their stall timeout.
	cl := gw.cl
	if h.local != nil {
		h.local.cl.Store(cl)
	}
	gw.workers = workers
	workers.OnGone(func(id, why string) { cl.WorkerLost(id, why) })
	limit := cfg.HTTP.BodyLimit
	if mp := int(gw.nc.MaxPayload()) - 16<<10; mp > 0 && mp < limit {
		limit = mp // headers need room too
	}
	// Secrets this process holds, kept out of what error bodies and log
	// lines quote of a request (API keys are recognised by their shape).
	redactor := gateway.NewRedactor(cfg.HTTP.AdminToken, cfg.NATS.Password, cfg.NATS.Token)
	gcfg := gateway.Config{
		Redactor:            redactor,
		BodyLimit:           limit,
		RequestTimeout:      cfg.HTTP.RequestTimeout,
		HoldKeepalive:       cfg.HTTP.HoldKeepalive,
		ReadyWithoutWorkers: cfg.HTTP.ReadyWithoutWorkers,
		ShutdownTimeout:     cfg.HTTP.ShutdownTimeout,
		Version:             cfg.Version,
		FlowFromUser:        cfg.HTTP.FlowFromUser,
		CORS:                cfg.HTTP.CORS,
		Metrics:             h.gatherer(reg),
	}
	trusted, _ := gateway.ParseTrustedProxies(cfg.HTTP.TrustedProxies) // checked above
	throttle := gateway.ThrottleConfig{Failures: cfg.HTTP.AuthFailures}
	if store != nil {
		lim := cfg.HTTP.Limits
		if store.Breaker() == nil {
			store.UseBreaker(newBreaker(lim.Breaker, reg, log))
		}
		limiter := registry.NewLimiter(store)
		if err := gw.startUsage(limiter, reg); err != nil {
			return err
		}
		acfg := auth.Config{Limiter: limiter, Log: log, Metrics: reg, TrustedProxies: trusted, FailClosed: lim.FailClosed,
			DefaultMaxTokens: lim.DefaultMaxTokens, Usage: gw.pub.Publish}
		if cache != nil {
			acfg.MaxTokens = func(model string) int { m, _ := cache.Get(model); return m.MaxModelLen }
		}
		if cfg.HTTP.Auth {
			acfg.Throttle = gateway.NewThrottle(throttle, "API key", "openai", log, reg)
			acfg.Keys = registry.NewKeyCache(store, cfg.HTTP.KeyCacheTTL, log)
			acfg.Keys.MaxStale = lim.KeyMaxStale
			if gw.unsubKeys, err = acfg.Keys.Subscribe(gw.nc); err != nil {
				return err
			}
		}
		gw.au = auth.New(acfg)
		gcfg.OnUsage = gw.au.OnUsage
		if cfg.HTTP.Auth {
			gcfg.Authorize = gw.au.Authorize
			gcfg.ModelAccess = gw.au.ModelAccess
		}
	}
	if store != nil {
		// Whether an API key was deleted, for the work queued under it
		// (batch lines, background responses, resumable streams): cached,
		// told of deletions by the keys event.
		gw.revoked = registry.NewRevocations(store, cfg.HTTP.KeyCacheTTL, componentLog(cfg.Log, "gateway"))
		if _, err := gw.revoked.Subscribe(gw.nc); err != nil { // ends with the connection
			return err
		}
	}
	// Tenants' quotas: the stores that keep tenants' data check them before
	// writing (without Redis, the defaults hold for everyone).
	// The defaults of the responses' quotas are the Responses flags'.
	defaults, rq := cfg.HTTP.Quotas, cfg.HTTP.Responses.Quota
	defaults.StoredResponses, defaults.Background, defaults.Resumable = int64(rq.Stored), int64(rq.Background), int64(rq.Resumable)
	gw.quotas = registry.NewQuotaCache(store, defaults, cfg.HTTP.QuotaCacheTTL, log)
	if store != nil {
		if gw.unsubQuotas, err = gw.quotas.Subscribe(gw.nc); err != nil {
			return err
		}
	}
	if gcfg.Responses, err = gw.startResponses(ctx); err != nil {
		return err
	}
	if gcfg.Batches, err = gw.startBatch(ctx, workers, store, reg); err != nil {
		return err
	}
	gcfg.FileLimit = cfg.HTTP.Batch.FileLimit
	gcfg.UploadsMax, gcfg.UploadsPerTenant = cfg.HTTP.Batch.UploadsMax, cfg.HTTP.Batch.UploadsPerTenant
	if gw.au != nil && cfg.HTTP.Auth {
		gcfg.Identify = gw.au.Identify
	}
	var models gateway.Registry
	if cache != nil {
		models = cache
	}
	gw.g = gateway.New(gcfg, gw.cl, gateway.NewCatalog(workers, models), gw.nc, reg, log)

	gw.ln = ln.view()
	if cfg.HTTP.Admin != "" {
		if gw.adm, err = admin.New(admin.Config{Token: cfg.HTTP.AdminToken, Store: store, NC: gw.nc, Fleet: workers,
			Log: componentLog(cfg.Log, "admin"), Redactor: redactor, TrustedProxies: trusted, Batches: gcfg.Batches,
			Quotas:  gw.quotas,
			APIAddr: gw.ln.Addr().String(), APIAuth: cfg.HTTP.Auth, Metrics: h.gatherer(reg),
			Throttle: gateway.NewThrottle(throttle, "admin token", "admin", componentLog(cfg.Log, "admin"), reg)}); err != nil {
			return err
		}
		gw.admLn = admLn.view()
		gw.part("admin API", func() error { return gw.adm.Serve(gw.admLn) })
	}
	gw.part("gateway", func() error { return gw.g.Serve(gw.ln) })
	return nil
}

// shutdown stops the HTTP side within ShutdownTimeout (open streams may
// finish; the admin API at once), waits for the usage of the last requests,
// then stops the embedded dispatcher.
func (gw *gatewayRun) shutdown() {
	sctx, cancel := context.WithTimeout(context.Background(), gw.cfg.HTTP.ShutdownTimeout)
	defer cancel()
	if gw.adm != nil {
		_ = gw.adm.Shutdown(sctx)
	}
	if gw.admLn != nil {
		// A Serve that had not begun when the program failed would serve a
		// listener Shutdown did not know of: closed, it returns at once.
		_ = gw.admLn.Close()
	}
	if gw.g != nil {
		if err := gw.g.Shutdown(sctx); err != nil {
			gw.log.Warn("gateway shutdown", "err", err)
		}
	}
	if gw.ln != nil {
		_ = gw.ln.Close()
	}
	if gw.au != nil {
		_ = gw.au.Wait(sctx)
	}
	gw.stopUsageAfter(sctx)
	if gw.cl != nil {
		_ = gw.cl.Close()
	}
	if gw.stopDisp != nil {
		gw.stopDisp()
	}
}

func (gw *gatewayRun) release() {
	if gw.unsubKeys != nil {
		gw.unsubKeys()
	}
	if gw.unsubQuotas != nil {
		gw.unsubQuotas()
	}
	gw.watch.close()
	if gw.store != nil {
		_ = gw.store.Close()
	}
}

// Quotas is the gateway's view of tenants' quotas (its current run's):
// Lookup is what a store that enforces them is handed.
func (g *Gateway) Quotas() *registry.QuotaCache { return g.run().quotas }
