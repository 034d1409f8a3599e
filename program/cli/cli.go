package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/bench"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/tracing/otlp"
)

// Version is set at build time with -ldflags "-X .../program/cli.Version=...".
var Version = "0.1.0-dev"

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"dev", "everything in one process: embedded NATS and store, dispatcher, sim workers, gateway", runDev},
		{"gateway", "the OpenAI-compatible HTTP gateway", runGateway},
		{"dispatcher", "routes requests to workers; run any number", runDispatcher},
		{"worker", "drives one inference engine", runWorker},
		{"sim-server", "the sim engine behind vLLM's HTTP API", runSimServer},
		{"redis", "redis migrate: copy a registry of the layout before Cluster support into today's (docs/redis.md)", runRedis},
		{"nats-users", "print the NATS users entries of NATS-native tenants (their permissions)", runNATSUsers},
		{"bench", "load generator for any OpenAI-compatible endpoint", bench.Run},
		{"batch", "submit a batch (tokenbus batch submit FILE.jsonl --model M --wait) and follow it to its output file", runBatch},
		{"version", "print the version", runVersion},
	}
}

// Run runs the subcommand named by args[0].
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			if errors.Is(err, pflag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tokenbus: an OpenAI-compatible LLM serving system over NATS")
	fmt.Fprintln(w, "\nUsage: tokenbus <command> [flags]   (tokenbus <command> --help for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nEvery flag can also be set in the environment as TOKENBUS_<FLAG>, e.g. TOKENBUS_NATS_URL.")
}

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) error {
	fmt.Fprintln(stdout, "tokenbus", Version)
	return nil
}

// logOptions are the logging flags of every long-running command.
type logOptions struct {
	level  string
	format string
	pprof  string
}

func (o *logOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.format, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.pprof, "pprof", "", "listen address for Go's /debug/pprof profiler (empty: off; keep it on loopback)")
}

// processOptions are the flags every long-running component shares: logs,
// profiling and tracing.
type processOptions struct {
	logOptions
	traceOptions
}

func (o *processOptions) register(fs *pflag.FlagSet) {
	o.logOptions.register(fs)
	o.traceOptions.register(fs)
}

// start sets up logging, the profiler and tracing for component; stop
// flushes the traces. base is the logger to hand to the program, which names
// its components on it; own is the command's, for its own lines.
func (o *processOptions) start(ctx context.Context, stderr io.Writer, component string) (base, own *slog.Logger, stop func(), err error) {
	base, err = o.logger(stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	own = base.With("component", component)
	routeRedisLog(base)
	o.servePprof(own)
	if stop, err = o.setup(ctx, "tokenbus-"+component, own); err != nil {
		return nil, nil, nil, err
	}
	return base, own, stop, nil
}

// servePprof serves net/http/pprof on --pprof, if set, for profiling a
// running process (go tool pprof http://ADDR/debug/pprof/profile).
func (o *logOptions) servePprof(log *slog.Logger) {
	if o.pprof == "" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Addr: o.pprof, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil {
			log.Warn("pprof listener stopped", "addr", o.pprof, "err", err)
		}
	}()
}

// logger is the process's logger, with no component: the programs name
// their components on it (one component key per line).
func (o *logOptions) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch strings.ToLower(o.format) {
	case "json":
		h = slog.NewJSONHandler(w, hopts)
	case "text":
		h = slog.NewTextHandler(w, hopts)
	default:
		return nil, fmt.Errorf("--log-format must be text or json, not %q", o.format)
	}
	return slog.New(h), nil
}

// traceOptions are the tracing flags of every command that runs components.
type traceOptions struct {
	endpoint string
	headers  map[string]string
	ratio    float64
}

func (o *traceOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.endpoint, "otlp-endpoint", "", "OTLP/HTTP collector to export traces to, e.g. http://127.0.0.1:4318 (/v1/traces is appended to a URL with no path); empty: tracing off")
	fs.StringToStringVar(&o.headers, "otlp-headers", nil, "headers sent with every trace export, key=value,... (collector authentication)")
	fs.Float64Var(&o.ratio, "trace-sample-ratio", 1, "share of new traces sampled, 0 to 1; a request with a traceparent follows its sampled flag")
}

// setup turns tracing on if an endpoint is set; stop flushes the spans
// still buffered (within 5s) and turns it off.
func (o *traceOptions) setup(ctx context.Context, service string, log *slog.Logger) (stop func(), err error) {
	shutdown, err := otlp.Setup(ctx, otlp.Options{Endpoint: o.endpoint, ServiceName: service, ServiceVersion: Version,
		SampleRatio: o.ratio, Headers: o.headers, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if o.endpoint != "" {
		log.Info("tracing on", "otlp_endpoint", o.endpoint, "sample_ratio", o.ratio)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("spans not exported at shutdown", "err", err)
		}
	}, nil
}

// parse parses a subcommand's flags with environment fallbacks; --help prints
// usage to stdout.
func parse(fs *pflag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage of tokenbus %s:\n", fs.Name())
		fs.PrintDefaults()
	}
	return flagenv.Parse(fs, args, os.Getenv)
}

// handle is a started program's handle (package program).
type handle interface {
	Done() <-chan struct{}
	Close() error
}

// untilDone runs p until ctx ends (a signal: then onSignal, if set, and a
// graceful Close) or p ends by itself; it returns p's error, nil after a
// clean stop.
func untilDone(ctx context.Context, p handle, onSignal func()) error {
	select {
	case <-ctx.Done():
		if onSignal != nil {
			onSignal()
		}
	case <-p.Done():
	}
	return p.Close()
}
