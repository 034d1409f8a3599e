package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/registry"
)

type dispatcherOptions struct {
	id           string
	queueSize    int
	queueTimeout time.Duration
	replyPrefix  []string
}

func (o *dispatcherOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.id, "dispatcher-id", "", "dispatcher id (default: random)")
	fs.IntVar(&o.queueSize, "queue-size", 1024, "requests that may wait per model when every worker is full; past it: 503")
	fs.DurationVar(&o.queueTimeout, "queue-timeout", 60*time.Second, "longest time a request may wait in the queue")
	fs.StringSliceVar(&o.replyPrefix, "reply-prefix", []string{"_INBOX."}, "subject prefixes a request's reply subject must have (others are dropped)")
}

func (o *dispatcherOptions) config() dispatcher.Config {
	return dispatcher.Config{ID: o.id, QueueSize: o.queueSize, QueueTimeout: o.queueTimeout, ReplyPrefixes: o.replyPrefix}
}

func runDispatcher(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("dispatcher")
	var nopts natsconn.Options
	var dopts dispatcherOptions
	var popts processOptions
	nopts.Register(fs)
	dopts.register(fs)
	redisURL := fs.String("redis-url", "redis://127.0.0.1:6379/0", "Redis holding the model registry (empty: none; unknown models then get 404)")
	metricsAddr := fs.String("metrics", "", "listen address for /metrics (empty: off)")
	popts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	log, stop, err := popts.start(ctx, stderr, "dispatcher")
	if err != nil {
		return err
	}
	defer stop()
	nc, err := nopts.Connect(ctx, "tokenbus-dispatcher", 30*time.Second, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	var models dispatcher.Registry
	if *redisURL != "" {
		store, err := registry.Open(ctx, *redisURL)
		if err != nil {
			return err
		}
		defer store.Close()
		cache := registry.NewCache(store, log)
		go cache.Run(ctx, nc, 10*time.Second)
		models = cache
	}
	reg := newRegistry()
	if *metricsAddr != "" {
		stopMetrics, err := serveMetrics(*metricsAddr, reg)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	d := dispatcher.New(dopts.config(), nc, models, reg, log)
	if err := d.Run(ctx); err != nil {
		return err
	}
	natsconn.Drain(nc, 5*time.Second)
	return nil
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves /metrics of reg on addr (for processes with no other HTTP listener).
func serveMetrics(addr string, reg *prometheus.Registry) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
