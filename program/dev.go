package program

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/embedded"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// DevConfig configures dev: all of tokenbus in one process.
type DevConfig struct {
	HTTP       HTTPConfig        // the gateway's; an empty AdminToken with the admin API on is a random one
	Dispatcher dispatcher.Config // the one dispatcher: the gateway's, and the request subjects' for NATS-native clients
	// Worker is every worker's; IDs are dev-worker-1, dev-worker-2...
	Worker workers.Config
	Engine EngineConfig
	// SimWorkers is the number of workers with the sim engine; with another
	// engine one worker fronts it.
	SimWorkers int
	// PrefillWorkers: this many more sim workers, of role prefill
	// (dev-prefill-1...), and the SimWorkers of role decode: prefill/decode
	// disaggregation in one process (docs/disaggregation.md). Sim only.
	PrefillWorkers int
	// Adapters are LoRA adapters registered on the first served model, as
	// name=path.
	Adapters   []string
	NATSListen string            // where the embedded NATS server listens ("host:port"; port -1: any free port)
	Redis      registry.Topology // a Redis to use instead of the embedded store (none configured: the embedded one)
	DataDir    string            // JetStream storage ("" : a temporary directory, removed at the end)
	Version    string
	Log        *slog.Logger // gets every line, each with its component (dev, gateway, dispatcher, worker, engine): give it none of its own

	// ExampleAdapter: with the sim engine and no Adapters, register
	// ExampleAdapter(model) on the served model, so that a LoRA adapter can
	// be tried at once.
	ExampleAdapter bool
}

// ExampleAdapter is the adapter dev registers on model with the sim engine
// (DevConfig.ExampleAdapter), as name=path: named after the model, so that
// `--model X` does not get another model's adapter: "<X>-lora", X's last
// path element with characters other than letters, digits, '.', '_' and '-'
// as '-' (it is a path segment of the TorchServe routes), path
// "sim://<name>". llama-8b gets llama-8b-lora.
func ExampleAdapter(model string) string {
	model = strings.TrimRight(model, "/")
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		model = model[i+1:]
	}
	name := strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && (r == '.' || r == '_' || r == '-' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
			return r
		}
		return '-'
	}, model) + "-lora"
	return name + "=sim://" + name
}

// DefaultDev is `tokenbus dev` with no flags.
func DefaultDev() DevConfig {
	h := DefaultHTTP()
	h.Listen = "127.0.0.1:8080"
	h.Auth = false
	// Ctrl-C on a laptop should not wait 10 s.
	h.ShutdownTimeout = 1500 * time.Millisecond
	return DevConfig{
		HTTP:       h,
		Dispatcher: DefaultDispatcherConfig(),
		Worker:     workers.Config{MaxConcurrency: 256, DrainTimeout: time.Second, SwitchHold: 30 * time.Second},
		Engine:     DefaultEngine(),
		SimWorkers: 2,
		NATSListen: "127.0.0.1:4222",

		ExampleAdapter: true,
	}
}

// Dev is a running dev program: an embedded NATS server and store, and a
// dispatcher, workers and a gateway started as their own programs.
type Dev struct {
	*life
	cfg DevConfig
	log *slog.Logger

	dir       string // the temporary data directory, removed at the end
	ns        *server.Server
	mr        *miniredis.Miniredis
	storeTopo registry.Topology
	store     *registry.Store
	nc        *nats.Conn      // dev's own: model registration and the model cache
	engines   []engine.Engine // not yet handed to a worker
	served    []string
	adapters  []string
	nWorkers  int

	dispatcher *Dispatcher
	workers    []*Worker
	gateway    *Gateway
}

// StartDev starts dev and returns once the gateway serves, which is once the
// dispatcher knows every worker (their first heartbeat; at most 5s).
func StartDev(ctx context.Context, cfg DevConfig) (*Dev, error) {
	d := &Dev{life: newLife(), cfg: cfg, log: componentLog(cfg.Log, "dev")}
	err := d.start(ctx)
	if err := d.begin(err, d.shutdown, d.release); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Dev) start(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	var err error
	dir := cfg.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "tokenbus-dev-"); err != nil {
			return err
		}
		d.dir = dir
	}
	if d.ns, err = embedded.NATS(cfg.NATSListen, dir); err != nil {
		return err
	}
	d.storeTopo = cfg.Redis
	if !d.storeTopo.Configured() {
		// The embedded store has no replicas to wait for (nor WAIT).
		var url string
		if d.mr, url, err = embedded.Redis(); err != nil {
			return err
		}
		d.storeTopo = registry.Topology{URL: url}
	}
	if d.store, err = registry.OpenTopology(ctx, d.storeTopo); err != nil {
		return err
	}
	dial := dialInProcess(d.ns)
	if d.nc, err = dial(ctx, natsconn.Options{}, "tokenbus-dev", log); err != nil {
		return err
	}

	// Engines first: an HTTP engine tells which models it serves.
	d.nWorkers = cfg.SimWorkers
	if cfg.Engine.Kind != "sim" {
		d.nWorkers = 1 // one worker fronts the one engine
		if cfg.PrefillWorkers > 0 {
			return fmt.Errorf("--prefill-workers goes with --engine sim")
		}
	}
	d.nWorkers += cfg.PrefillWorkers
	cfg.Engine.SleepMode = cfg.Worker.SleepAfter > 0
	for range d.nWorkers {
		eng, err := newEngine(ctx, cfg.Engine, componentLog(cfg.Log, "engine"))
		if err != nil {
			return err
		}
		d.engines = append(d.engines, eng)
	}
	d.served = []string{cfg.Engine.Model}
	if len(d.engines) > 0 {
		d.served = servable(d.engines[0])
	}
	if err := ensureModels(ctx, d.store, d.served, d.nc); err != nil {
		return err
	}
	if len(d.served) > 0 {
		specs := cfg.Adapters
		if len(specs) == 0 && cfg.ExampleAdapter && cfg.Engine.Kind == "sim" {
			specs = []string{ExampleAdapter(d.served[0])}
		}
		if d.adapters, err = registerAdapters(ctx, d.store, d.served[0], specs, d.nc, log); err != nil {
			return err
		}
	}
	if cfg.HTTP.Admin != "" && cfg.HTTP.AdminToken == "" {
		d.cfg.HTTP.AdminToken = randomToken()
	}
	cache := registry.NewCache(d.store, log)
	_ = cache.Refresh(ctx)
	d.part("registry cache", func() error { cache.Run(d.ctx, d.nc, 10*time.Second); return nil })

	// Every program gets its own connection, as in a distributed deployment,
	// and one metrics registry: the gateway's /metrics shows them all.
	h := host{dial: dial, store: d.store, cache: cache, metrics: newGatherers(), local: &inProcess{}}
	devReg := newRegistry()
	h.metrics.set("dev", devReg)
	registerConnMetrics(devReg, d.nc, cache)
	// The programs name their components on cfg.Log themselves.
	if d.dispatcher, err = startDispatcher(ctx, DispatcherConfig{Dispatcher: cfg.Dispatcher,
		Limits: cfg.HTTP.Limits, Log: cfg.Log}, h); err != nil {
		return err
	}
	d.part("dispatcher", d.dispatcher.Wait)
	for i := range d.engines {
		wh := h
		wh.engine, d.engines[i] = d.engines[i], nil // the worker closes it
		wcfg := cfg.Worker
		wcfg.ID = fmt.Sprintf("dev-worker-%d", i+1)
		if cfg.PrefillWorkers > 0 {
			wcfg.Role = schemas.RoleDecode
			if n := i - (d.nWorkers - cfg.PrefillWorkers); n >= 0 {
				wcfg.ID, wcfg.Role = fmt.Sprintf("dev-prefill-%d", n+1), schemas.RolePrefill
			}
		}
		w, err := startWorker(ctx, WorkerConfig{Worker: wcfg, Version: cfg.Version, Log: cfg.Log}, wh)
		if err != nil {
			return err
		}
		d.workers = append(d.workers, w)
		d.part(wcfg.ID, w.Wait)
	}
	if err := d.waitFleet(ctx); err != nil {
		return err
	}
	h.dispatcher = func() *dispatcher.Dispatcher { return d.dispatcher.run().d }
	if d.gateway, err = startGateway(ctx, GatewayConfig{HTTP: d.cfg.HTTP, Version: cfg.Version,
		Log: cfg.Log}, h); err != nil {
		return err
	}
	// The gateway routes through the dispatcher's current run.
	d.dispatcher.k.setOnRestart(d.gateway.k.renew)
	d.part("gateway", d.gateway.Wait)
	return nil
}

// waitFleet waits, at most 5s, until the dispatcher knows every worker (their
// first heartbeat), so that the first request finds them.
func (d *Dev) waitFleet(ctx context.Context) error {
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for d.dispatcher.run().d.Fleet().Len() < len(d.workers) {
		select {
		case <-tick.C:
		case <-deadline.C:
			return nil // serve anyway: a worker's heartbeat is late, not lost
		case <-d.ctx.Done():
			return errPartFailed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// shutdown stops the programs together: the gateway lets open streams finish
// while the workers drain, both bounded (ShutdownTimeout, DrainTimeout).
func (d *Dev) shutdown() {
	var wg sync.WaitGroup
	closeIt := func(p interface{ Close() error }) {
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Close() }() // a failure is the part's error already
	}
	if d.gateway != nil {
		closeIt(d.gateway)
	}
	if d.dispatcher != nil {
		closeIt(d.dispatcher)
	}
	for _, w := range d.workers {
		closeIt(w)
	}
	wg.Wait()
}

// release frees what the programs ran on, once they have ended.
func (d *Dev) release() {
	for _, e := range d.engines {
		if e != nil {
			e.Close()
		}
	}
	drain(d.nc)
	if d.store != nil {
		_ = d.store.Close()
	}
	if d.mr != nil {
		d.mr.Close()
	}
	if d.ns != nil {
		d.ns.Shutdown()
		d.ns.WaitForShutdown()
	}
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}

// Addr is the OpenAI API's bound address (host:port).
func (d *Dev) Addr() string { return d.gateway.Addr() }

// AdminAddr is the admin API's bound address, "" when it is off.
func (d *Dev) AdminAddr() string { return d.gateway.AdminAddr() }

// AdminToken is the admin API's token: the configured one, or the random one
// dev made.
func (d *Dev) AdminToken() string { return d.cfg.HTTP.AdminToken }

// NATSURL is the embedded NATS server's client URL.
func (d *Dev) NATSURL() string { return d.ns.ClientURL() }

// StoreURL is the Redis URL of the store: the configured one (whichever
// of the topology's URLs is set), or the embedded store's.
func (d *Dev) StoreURL() string {
	t := d.storeTopo
	return cmp.Or(t.URL, t.Sentinel, t.Cluster)
}

// Store is the Redis the store is on: the configured topology, or the
// embedded store's URL.
func (d *Dev) Store() registry.Topology { return d.storeTopo }

// Models are the base models the engines serve (the configured model when
// there is no worker).
func (d *Dev) Models() []string { return d.served }

// Adapters are the names of the LoRA adapters dev registered.
func (d *Dev) Adapters() []string { return d.adapters }

// Workers is the number of workers.
func (d *Dev) Workers() int { return d.nWorkers }

// randomToken makes an admin token for dev.
func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "adm-" + base64.RawURLEncoding.EncodeToString(b)
}
