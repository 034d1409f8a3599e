package cli

import (
	"cmp"
	"context"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/program"
)

// registerDispatcher defines the dispatcher's flags on c, c's values as
// defaults.
func registerDispatcher(fs *pflag.FlagSet, c *dispatcher.Config) {
	fs.StringVar(&c.ID, "dispatcher-id", c.ID, "dispatcher id (default: random)")
	fs.IntVar(&c.QueueSize, "queue-size", c.QueueSize, "requests that may wait per model when every worker is full; past it: 503")
	fs.DurationVar(&c.QueueTimeout, "queue-timeout", c.QueueTimeout, "longest time a request may wait in the queue")
	fs.DurationVar(&c.ColdStartTimeout, "cold-start-timeout", cmp.Or(c.ColdStartTimeout, 5*time.Minute), "longest time a request for a registered model that no live worker serves waits for one to start, wake or switch (docs/capacity.md); never past its deadline")
	fs.StringSliceVar(&c.ReplyPrefixes, "reply-prefix", c.ReplyPrefixes, "subject prefixes a request's reply subject must have (others are dropped)")
	fs.BoolVar(&c.NoPrefixRouting, "no-prefix-routing", c.NoPrefixRouting, "route by load only, not also to the worker that holds the prompt's prefix in its KV cache (docs/routing.md)")
	fs.Float64Var(&c.CacheWeight, "prefix-cache-weight", cmp.Or(c.CacheWeight, 1), "prefix-aware routing: how much load ratio (in flight over max concurrency) a fully cached prompt is worth")
	fs.BoolVar(&c.Placement.On, "adapter-placement", c.Placement.On, "place LoRA adapters by demand: load hot adapters onto more workers ahead of requests, unload cold spare replicas (docs/routing.md); best on one dispatcher")
	fs.Float64Var(&c.Placement.Up, "adapter-placement-up", cmp.Or(c.Placement.Up, 4), "adapter placement: add a replica while an adapter's requests/s per replica (as this dispatcher sees them) are above this")
	fs.Float64Var(&c.Placement.Down, "adapter-placement-down", cmp.Or(c.Placement.Down, 1), "adapter placement: unload a spare replica while requests/s per remaining replica would be below this (at most half of --adapter-placement-up)")
	fs.DurationVar(&c.Placement.MinInterval, "adapter-placement-interval", cmp.Or(c.Placement.MinInterval, 30*time.Second), "adapter placement: least time between two changes of one adapter's replicas")
	fs.Float64Var(&c.PromptTokenCost, "prompt-token-cost", cmp.Or(c.PromptTokenCost, 1.0/32), "flow control: what a prompt token costs, in output tokens, in a request's estimated engine time (docs/scheduling.md)")
	fs.IntVar(&c.DefaultOutputTokens, "default-output-tokens", cmp.Or(c.DefaultOutputTokens, 256), "flow control: the output a request with no max_tokens is charged for until its real usage settles it")
	fs.IntVar(&c.Disagg.MinPromptTokens, "disagg-min-prompt-tokens", c.Disagg.MinPromptTokens, "prefill/decode disaggregation: a prompt with at least this many tokens (estimated: text bytes / 4) not already cached on the decode worker chosen is prefilled on a prefill worker (worker --role prefill), when one has room (docs/disaggregation.md); 0: never")
	fs.IntVar(&c.PrefixBlockBytes, "prefix-block-bytes", cmp.Or(c.PrefixBlockBytes, 64), "prefix-aware routing: bytes of prompt text per hashed block (about 16 tokens at 64); must match the workers' KV events")
}

func runDispatcher(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("dispatcher")
	cfg := program.DefaultDispatcher()
	var popts processOptions
	cfg.NATS.Register(fs)
	registerDispatcher(fs, &cfg.Dispatcher)
	rf := registerRedis(fs, &cfg.Redis, "Redis holding the model registry, and the API keys and limits of NATS-native tenant requests (empty: none; unknown models then get 404, tenant requests are dropped)", false)
	registerLimits(fs, &cfg.Limits)
	fs.StringVar(&cfg.Metrics, "metrics", cfg.Metrics, "listen address for /metrics (empty: off)")
	popts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	log, own, stop, err := popts.start(ctx, stderr, "dispatcher")
	if err != nil {
		return err
	}
	defer stop()
	cfg.Log = log
	d, err := program.StartDispatcher(ctx, cfg)
	if err != nil {
		return err
	}
	if d.Addr() != "" {
		own.Info("metrics listening", "metrics", "http://"+d.Addr()+"/metrics", "dispatcher", d.ID())
	}
	return untilDone(ctx, d, nil)
}
