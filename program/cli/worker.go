package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("worker")
	cfg := program.DefaultWorker()
	var popts processOptions
	cfg.NATS.Register(fs)
	fs.StringVar(&cfg.Worker.ID, "id", cfg.Worker.ID, "worker id, unique in the cluster (default: host name + random suffix)")
	fs.IntVar(&cfg.Worker.MaxConcurrency, "max-concurrency", cfg.Worker.MaxConcurrency, "hard cap on requests in flight; past it the worker hands requests back (with --vllm-cmd and no value given: its --max-num-seqs, so that requests wait in the dispatcher's fair queue, not in vLLM's first-come one)")
	fs.DurationVar(&cfg.Worker.DrainTimeout, "drain-timeout", cfg.Worker.DrainTimeout, "on SIGTERM, how long in-flight requests may run before they are cancelled (also before a model switch)")
	fs.DurationVar(&cfg.Worker.SwitchHold, "switch-hold", cfg.Worker.SwitchHold, "an engine of several models (--sim-models, --vllm-model): how long a model stays loaded at least before the worker switches away from it, so that two busy models do not make it thrash")
	fs.DurationVar(&cfg.Worker.SleepAfter, "sleep-after", cfg.Worker.SleepAfter, "put the engine to sleep after this long with no request (vLLM's sleep mode: GPU memory freed, weights kept in CPU memory); the next request wakes it. sim and vllm only; vllm needs --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (given to a --vllm-cmd child). 0: never (docs/capacity.md)")
	rf := registerRedis(fs, &cfg.Redis, "Redis holding the model registry; when set the worker registers its models there", false)
	fs.StringVar(&cfg.Worker.Role, "role", "both", "prefill/decode disaggregation (docs/disaggregation.md): prefill (runs only the prefills of disaggregated requests), decode (takes requests, prefilled on a prefill worker when a dispatcher so decides) or both (neither pool: every request whole). prefill and decode need the sim or vllm engine, vLLM started with --kv-transfer-config")
	fs.StringVar(&cfg.Metrics, "metrics", cfg.Metrics, "listen address for /metrics (empty: off)")
	registerEngine(fs, &cfg.Engine)
	popts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	role, ok := schemas.ParseRole(cfg.Worker.Role)
	if !ok {
		return fmt.Errorf("--role %q: want prefill, decode or both", cfg.Worker.Role)
	}
	cfg.Worker.Role = role
	// Hold, don't commit (docs/scheduling.md): the cap is what the engine
	// runs at once, unless said otherwise.
	if !fs.Changed("max-concurrency") && cfg.Engine.Kind == "vllm" {
		cmd := cfg.Engine.VLLMCmd
		if cmd == "" && len(cfg.Engine.VLLMModels) > 0 { // the first model's (each should have the same)
			_, cmd, _ = strings.Cut(cfg.Engine.VLLMModels[0], "=")
		}
		if n, err := strconv.Atoi(httpengine.FlagValue(cmd, "--max-num-seqs")); err == nil && n > 0 {
			cfg.Worker.MaxConcurrency = n
		}
	}
	log, own, stop, err := popts.start(ctx, stderr, "worker")
	if err != nil {
		return err
	}
	defer stop()
	cfg.Log, cfg.Version = log, Version
	w, err := program.StartWorker(ctx, cfg)
	if err != nil {
		return err
	}
	if w.Addr() != "" {
		own.Info("metrics listening", "metrics", "http://"+w.Addr()+"/metrics", "worker", w.ID())
	}
	return untilDone(ctx, w, nil)
}
