package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/embedded"
	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/workers"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("dev")
	var gopts gatewayOptions
	var eopts engineOptions
	var dopts dispatcherOptions
	var wopts workerOptions
	var popts processOptions
	gopts.register(fs, "127.0.0.1:8080", false)
	adapters := fs.StringSlice("adapters", []string{"llama-8b-lora=sim://llama-8b-lora"},
		`LoRA adapters to register on the served model, as name=path pairs (the default only with --engine sim; "" for none)`)
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "where the embedded NATS server listens for NATS-native clients and the nats CLI (port -1: any free port)")
	redisURL := fs.String("redis-url", "", "use this Redis instead of the embedded store")
	dataDir := fs.String("data-dir", "", "JetStream storage directory (default: a temporary directory)")
	simWorkers := fs.Int("sim-workers", 2, "number of sim workers (with --engine vllm or openai, one worker fronts the engine)")
	fs.IntVar(&wopts.maxConcurrency, "max-concurrency", 256, "per-worker cap on requests in flight")
	fs.DurationVar(&wopts.drainTimeout, "drain-timeout", time.Second, "on Ctrl-C, how long in-flight requests may run before they are cancelled")
	eopts.register(fs)
	dopts.register(fs)
	popts.register(fs)
	// Ctrl-C on a laptop should not wait 10 s: dev's own default, shown in --help.
	if f := fs.Lookup("shutdown-timeout"); f != nil {
		_ = f.Value.Set("1.5s")
		f.DefValue = f.Value.String()
	}
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	log, stop, err := popts.start(ctx, stderr, "dev")
	if err != nil {
		return err
	}
	defer stop()

	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "tokenbus-dev-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	ns, err := embedded.NATS(*natsListen, dir)
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	connect := func(name string) (*nats.Conn, error) {
		opts, err := (&natsconn.Options{}).NatsOptions(name, log) // the async-error logging every process has
		if err != nil {
			return nil, err
		}
		return nats.Connect("", append(opts, nats.InProcessServer(ns))...)
	}

	url := *redisURL
	if url == "" {
		mr, u, err := embedded.Redis()
		if err != nil {
			return err
		}
		defer mr.Close()
		url = u
	}
	store, err := registry.Open(ctx, url)
	if err != nil {
		return err
	}
	defer store.Close()

	// Every component gets its own connection, as in a distributed deployment.
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	conn := func(name string) (*nats.Conn, error) {
		nc, err := connect(name)
		if err == nil {
			conns = append(conns, nc)
		}
		return nc, err
	}
	reg := newRegistry()
	compCtx, stopComponents := context.WithCancel(context.Background())
	defer stopComponents()
	var wg sync.WaitGroup

	gwNC, err := conn("tokenbus-gateway")
	if err != nil {
		return err
	}
	dNC, err := conn("tokenbus-dispatcher")
	if err != nil {
		return err
	}
	// Engines first: an HTTP engine tells which models it serves.
	nWorkers := *simWorkers
	if eopts.kind != "sim" {
		nWorkers = 1 // one worker fronts the one engine
	}
	var engines []engine.Engine
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	for range nWorkers {
		eng, err := eopts.newEngine(ctx, log.With("component", "engine"))
		if err != nil {
			return err
		}
		engines = append(engines, eng)
	}
	served := []string{eopts.model}
	if len(engines) > 0 {
		served = engines[0].Models()
	}

	cache := registry.NewCache(store, log)
	if err := ensureModels(ctx, store, served, gwNC); err != nil {
		return err
	}
	if !fs.Changed("adapters") && eopts.kind != "sim" {
		*adapters = nil // the sim's example adapter means nothing to a real engine
	}
	var registered []string
	if len(served) > 0 {
		if registered, err = registerAdapters(ctx, store, served[0], *adapters, gwNC, log); err != nil {
			return err
		}
	}
	if gopts.admin != "" && gopts.adminToken == "" {
		gopts.adminToken = randomToken()
	}
	_ = cache.Refresh(ctx)
	go cache.Run(compCtx, gwNC, 10*time.Second)

	d := dispatcher.New(dopts.config(), dNC, cache, reg, log.With("component", "dispatcher"))
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := d.Run(compCtx); err != nil {
			log.Error("dispatcher stopped", "err", err)
		}
	}()
	if err := waitReady(ctx, d.Ready()); err != nil {
		return err
	}
	for i, eng := range engines {
		wNC, err := conn("tokenbus-worker")
		if err != nil {
			return err
		}
		w, err := workers.New(wopts.config(fmt.Sprintf("dev-worker-%d", i+1), reg), wNC, eng, log.With("component", "worker"))
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(compCtx); err != nil {
				log.Error("worker stopped", "err", err)
			}
		}()
		if err := waitReady(ctx, w.Ready()); err != nil {
			return err
		}
	}

	// Serve only once the dispatcher knows every worker (their first heartbeat).
	for deadline := time.Now().Add(5 * time.Second); d.Fleet().Len() < len(engines) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}

	gw, err := startGateway(compCtx, gopts, gatewayDeps{nc: gwNC, dispatcher: d, store: store, cache: cache, reg: reg, log: log.With("component", "gateway")})
	if err != nil {
		return err
	}
	addr := gw.addr
	natsURL := ns.ClientURL()
	models := strings.Join(served, ", ")
	if len(registered) > 0 {
		models += "; adapters " + strings.Join(registered, ", ")
	}
	fmt.Fprintf(stdout, "tokenbus dev %s is up\n", Version)
	fmt.Fprintf(stdout, "  OpenAI API   http://%s/v1   (models %s; %d workers on %s)\n", addr, models, nWorkers, eopts.engineDesc())
	if gopts.auth {
		fmt.Fprintln(stdout, "  API keys     required (--auth): create them with POST /keys on the admin API")
	}
	if gw.adminAddr != "" {
		fmt.Fprintf(stdout, "  admin API    http://%s   (token %s)\n", gw.adminAddr, gopts.adminToken)
	}
	fmt.Fprintf(stdout, "  metrics      http://%s/metrics\n", addr)
	fmt.Fprintf(stdout, "  NATS         %s\n", natsURL)
	fmt.Fprintf(stdout, "  store        %s\n", url)
	keyHeader := ""
	if gopts.auth {
		keyHeader = " -H 'Authorization: Bearer <key>'"
	}
	fmt.Fprintf(stdout, "Try:\n  curl -N http://%s/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"+
		"    -d '{\"model\":\"%s\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n", addr, keyHeader, firstOr(served, eopts.model))
	if len(registered) > 0 {
		fmt.Fprintf(stdout, "  curl http://%s/predictions/%s/1.0/v1/completions -H 'Content-Type: application/json'%s \\\n"+
			"    -d '{\"prompt\":\"Once upon a time\",\"max_tokens\":32}'\n", addr, registered[0], keyHeader)
	}
	if gw.adminAddr != "" {
		fmt.Fprintf(stdout, "  curl http://%s/models -H 'Authorization: Bearer %s'\n", gw.adminAddr, gopts.adminToken)
	}
	fmt.Fprintln(stdout, "Ctrl-C to stop.")

	<-ctx.Done()
	fmt.Fprintln(stdout, "shutting down")
	// The gateway lets open streams finish while the workers drain; both are
	// bounded (shutdown-timeout, drain-timeout) so Ctrl-C returns promptly.
	var sw sync.WaitGroup
	sw.Add(1)
	go func() { defer sw.Done(); gw.stop() }()
	stopComponents()
	wg.Wait()
	sw.Wait()
	return nil
}

// waitReady waits for a component to have subscribed to its subjects.
func waitReady(ctx context.Context, ready <-chan struct{}) error {
	select {
	case <-ready:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("a component did not start within 10s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}

// registerAdapters registers LoRA adapters given as name=path on base and
// returns their names. An adapter already registered differently is kept as
// it is, with a warning.
func registerAdapters(ctx context.Context, store *registry.Store, base string, specs []string, nc *nats.Conn, log *slog.Logger) ([]string, error) {
	var names []string
	for _, spec := range specs {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		name, path, ok := strings.Cut(spec, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--adapters: %q is not name=path", spec)
		}
		created, err := store.PutAdapter(ctx, registry.Model{Name: name, Base: base, Path: path, OwnedBy: "tokenbus"})
		if errors.Is(err, registry.ErrConflict) {
			log.Warn("adapter already registered differently; keeping it", "adapter", name, "err", err)
		} else if err != nil {
			return nil, fmt.Errorf("--adapters %s: %w", name, err)
		}
		if created {
			_ = registry.Announce(nc, name)
		}
		names = append(names, name)
	}
	return names, nil
}

// randomToken makes an admin token for dev.
func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "adm-" + base64.RawURLEncoding.EncodeToString(b)
}
