package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/program"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("dev")
	cfg := program.DefaultDev()
	var popts processOptions
	registerHTTP(fs, &cfg.HTTP)
	fs.StringSliceVar(&cfg.Adapters, "adapters", cfg.Adapters,
		`LoRA adapters to register on the served model, as name=path pairs; none given: with --engine sim, <model>-lora=sim://<model>-lora (<model>'s last path element); "" for none`)
	fs.StringVar(&cfg.NATSListen, "nats-listen", cfg.NATSListen, "where the embedded NATS server listens for NATS-native clients and the nats CLI (port -1: any free port)")
	rf := registerRedis(fs, &cfg.Redis, "use this Redis instead of the embedded store", true)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, `JetStream storage directory (files, batches, usage records), kept across restarts; "" is `+devStateDir+` in the current directory (remove it to start clean); "temp": a temporary directory removed at exit`)
	fs.IntVar(&cfg.SimWorkers, "sim-workers", cfg.SimWorkers, "number of sim workers (with --engine vllm or openai, one worker fronts the engine)")
	fs.IntVar(&cfg.PrefillWorkers, "prefill-workers", cfg.PrefillWorkers, "this many more sim workers, of role prefill, and the --sim-workers of role decode: prefill/decode disaggregation in one process (docs/disaggregation.md; the policy: --disagg-min-prompt-tokens)")
	fs.IntVar(&cfg.Worker.MaxConcurrency, "max-concurrency", cfg.Worker.MaxConcurrency, "per-worker cap on requests in flight")
	fs.DurationVar(&cfg.Worker.DrainTimeout, "drain-timeout", cfg.Worker.DrainTimeout, "on Ctrl-C, how long in-flight requests may run before they are cancelled (also before a model switch)")
	fs.DurationVar(&cfg.Worker.SleepAfter, "sleep-after", cfg.Worker.SleepAfter, "put each worker's engine to sleep after this long with no request; the next request wakes it (sim: --sim-wake-time; docs/capacity.md). 0: never")
	fs.DurationVar(&cfg.Worker.SwitchHold, "switch-hold", cfg.Worker.SwitchHold, "an engine of several models (--sim-models, --vllm-model): how long a model stays loaded at least before a worker switches away from it, so that two busy models do not make it thrash")
	registerEngine(fs, &cfg.Engine)
	registerDispatcher(fs, &cfg.Dispatcher)
	popts.register(fs)
	err := parse(fs, args, stdout)
	if err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	if dir, err := devDataDir(cfg.DataDir); err == nil {
		cfg.DataDir = dir
	} else if cfg.DataDir != "" {
		return err
	} else {
		// The default place is not to be had (a read-only directory, in a
		// container): dev runs, on a temporary one.
		fmt.Fprintf(stderr, "tokenbus dev: %v; JetStream data goes to a temporary directory, removed at exit\n", err)
		cfg.DataDir = ""
	}
	if fs.Changed("adapters") {
		cfg.ExampleAdapter = false // "" means none
	}
	log, _, stop, err := popts.start(ctx, stderr, "dev")
	if err != nil {
		return err
	}
	defer stop()
	cfg.Log, cfg.Version = log, Version
	d, err := program.StartDev(ctx, cfg)
	if err != nil {
		return err
	}
	devBanner(stdout, d, cfg)
	return untilDone(ctx, d, func() { fmt.Fprintln(stdout, "shutting down") })
}

// devStateDir is dev's JetStream directory by default, below the directory
// it runs in: each checkout (or project) has its own files and batches, and
// `rm -rf .tokenbus` starts clean. A per-user default (~/.local/state) was
// shared by every checkout, so one saw another's batches.
const devStateDir = ".tokenbus/jetstream"

// devDataDir resolves --data-dir: "" devStateDir in the current directory
// (made if missing), "temp" a temporary one (program.DevConfig's ""); the
// directory is returned absolute, as the banner shows it.
func devDataDir(v string) (string, error) {
	switch v {
	case "temp":
		return "", nil
	case "":
		v = filepath.FromSlash(devStateDir)
	}
	v, err := filepath.Abs(v)
	if err != nil {
		return "", fmt.Errorf("--data-dir: %w", err)
	}
	if err := os.MkdirAll(v, 0o700); err != nil {
		return "", fmt.Errorf("--data-dir: %w", err)
	}
	return v, nil
}

// devBanner prints where everything listens and how to try it.
func devBanner(w io.Writer, d *program.Dev, cfg program.DevConfig) {
	addr, admin, served, registered := d.Addr(), d.AdminAddr(), d.Models(), d.Adapters()
	models := strings.Join(served, ", ")
	if len(registered) > 0 {
		models += "; adapters " + strings.Join(registered, ", ")
	}
	fmt.Fprintf(w, "tokenbus dev %s is up\n", Version)
	fmt.Fprintf(w, "  OpenAI API   http://%s/v1   (models %s; %d workers on %s)\n", addr, models, d.Workers(), cfg.Engine.Desc())
	if cfg.HTTP.Auth {
		fmt.Fprintln(w, "  API keys     required (--auth): create them with POST /keys on the admin API")
	}
	if admin != "" {
		fmt.Fprintf(w, "  admin API    http://%s   (token %s)\n", admin, d.AdminToken())
		// The token rides in the fragment: browsers never send it to the
		// server (nor to its logs); the page moves it to session storage.
		fmt.Fprintf(w, "  console      %s\n", ConsoleURL(admin, d.AdminToken()))
	}
	if d.Workers() == 0 {
		// Scale from zero by hand (docs/capacity.md): requests wait for a worker.
		fmt.Fprintf(w, "  no worker    requests wait up to --cold-start-timeout for one; start one with:\n"+
			"                 tokenbus worker --nats-url %s %s %s\n", d.NATSURL(), redisFlag(d.Store()), d.StoreURL())
	}
	fmt.Fprintf(w, "  metrics      http://%s/metrics\n", addr)
	fmt.Fprintf(w, "  NATS         %s\n", d.NATSURL())
	fmt.Fprintf(w, "  store        %s\n", d.StoreURL())
	if cfg.DataDir != "" {
		fmt.Fprintf(w, "  JetStream    %s   (files, batches, usage: kept across restarts; to start clean, stop dev and remove it, or run with --data-dir temp)\n", cfg.DataDir)
	} else {
		fmt.Fprintln(w, "  JetStream    a temporary directory, removed at exit (--data-dir temp)")
	}
	keyHeader := ""
	if cfg.HTTP.Auth {
		keyHeader = " -H 'Authorization: Bearer <key>'"
	}
	fmt.Fprintf(w, "Try:\n  curl -N http://%s/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"+
		"    -d '{\"model\":\"%s\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n", addr, keyHeader, firstOr(served, cfg.Engine.Model))
	if len(registered) > 0 {
		fmt.Fprintf(w, "  curl http://%s/predictions/%s/1.0/v1/completions -H 'Content-Type: application/json'%s \\\n"+
			"    -d '{\"prompt\":\"Once upon a time\",\"max_tokens\":32}'\n", addr, registered[0], keyHeader)
	}
	if admin != "" {
		fmt.Fprintf(w, "  curl http://%s/models -H 'Authorization: Bearer %s'\n", admin, d.AdminToken())
	}
	fmt.Fprintln(w, "Ctrl-C to stop.")
}

// ConsoleURL is the web console's link that signs in at once.
func ConsoleURL(adminAddr, token string) string {
	return "http://" + adminAddr + "/console/#token=" + url.QueryEscape(token)
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}
