package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// runSimServer is `tokenbus sim-server`: the sim engine behind vLLM's own
// OpenAI-compatible HTTP API (package simserver). It takes the vLLM flags
// that mean something to the sim (--host, --port, --served-model-name,
// --max-model-len, --max-loras, --max-num-seqs, --block-size,
// --lora-modules, --api-key), so it can stand in for "vllm serve" in a
// vllm engine's --vllm-cmd.
func runSimServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("sim-server")
	listen := fs.String("listen", "127.0.0.1:8000", "listen address")
	host := fs.String("host", "", "vLLM's --host: replaces the host of --listen")
	port := fs.Int("port", 0, "vLLM's --port: replaces the port of --listen")
	model := fs.String("model", "llama-8b", "served model name (with --served-model-name: only the model's root in /v1/models, as vLLM's model path)")
	served := fs.StringSlice("served-model-name", nil, "vLLM's --served-model-name: the names served instead of --model, the first one in metrics")
	var cfg sim.Config
	registerSimFlags(fs, &cfg)
	maxModelLen := fs.Int("max-model-len", 0, "vLLM's name for --sim-max-model-len (0: that flag)")
	maxLoras := fs.Int("max-loras", 0, "vLLM's name for --sim-max-loras (0: that flag)")
	maxNumSeqs := fs.Int("max-num-seqs", 0, "vLLM's name for --sim-max-num-seqs (0: that flag)")
	blockSize := fs.Int("block-size", 0, "vLLM's name for --sim-block-size (0: that flag)")
	maxBatched := fs.Int("max-num-batched-tokens", 0, "prefill tokens admitted per step (0: the sim's default)")
	fs.Bool("enable-lora", true, "accepted for vLLM compatibility: the sim always serves LoRA adapters")
	loraModules := fs.StringArray("lora-modules", nil, "adapters loaded at start, vLLM's syntax: name=path or JSON {\"name\",\"path\"}; repeat the flag or list them after one, space-separated")
	apiKeys := fs.StringSlice("api-key", nil, "API keys required as 'Authorization: Bearer' on /v1 paths (default: $VLLM_API_KEY)")
	allowLoRA := fs.Bool("allow-runtime-lora", envTrue(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")),
		"offer /v1/load_lora_adapter and /v1/unload_lora_adapter (default: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as vLLM)")
	legacyErrors := fs.Bool("legacy-errors", false, "answer errors in vLLM's flat pre-0.10.1 shape {\"object\":\"error\",...}")
	gpuCache := fs.Bool("gpu-cache-metric", false, "also export vllm:gpu_cache_usage_perc (the KV-cache gauge's name before vLLM 0.10)")
	shutdownTimeout := fs.Duration("shutdown-timeout", 5*time.Second, "on SIGTERM, how long open requests may go on")
	var lopts logOptions
	lopts.register(fs)
	if err := parse(fs, expandNargs(args, "--lora-modules"), stdout); err != nil {
		return err
	}
	log, err := lopts.logger(stderr, "sim-server")
	if err != nil {
		return err
	}
	lopts.servePprof(log)

	addr := *listen
	if fs.Changed("host") || fs.Changed("port") {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("--listen %q: %v", addr, err)
		}
		if fs.Changed("host") {
			h = *host
		}
		if fs.Changed("port") {
			p = strconv.Itoa(*port)
		}
		addr = net.JoinHostPort(h, p)
	}
	names := []string{*model}
	if len(*served) > 0 {
		names = *served
	}
	cfg.Model, cfg.ServedNames = names[0], names[1:]
	for _, o := range []struct {
		v   int
		dst *int
	}{{*maxModelLen, &cfg.MaxModelLen}, {*maxLoras, &cfg.MaxLoras}, {*maxNumSeqs, &cfg.MaxNumSeqs},
		{*blockSize, &cfg.BlockSize}, {*maxBatched, &cfg.MaxNumBatchedTokens}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	keys := *apiKeys
	if len(keys) == 0 && os.Getenv("VLLM_API_KEY") != "" {
		keys = []string{os.Getenv("VLLM_API_KEY")}
	}
	type module struct{ name, path string }
	var modules []module
	for _, m := range *loraModules {
		var mod module
		if strings.HasPrefix(strings.TrimSpace(m), "{") {
			var j struct{ Name, Path string }
			if err := json.Unmarshal([]byte(m), &j); err != nil {
				return fmt.Errorf("--lora-modules %s: %v", m, err)
			}
			mod = module{j.Name, j.Path}
		} else {
			n, p, _ := strings.Cut(m, "=")
			mod = module{n, p}
		}
		if mod.name == "" || mod.path == "" {
			return fmt.Errorf("--lora-modules %q: want name=path", m)
		}
		modules = append(modules, mod)
	}

	eng, err := sim.New(cfg)
	if err != nil {
		return err
	}
	defer eng.Close()
	for _, m := range modules {
		if err := eng.LoadAdapter(ctx, m.name, m.path); err != nil {
			return fmt.Errorf("--lora-modules %s=%s: %v", m.name, m.path, err)
		}
	}
	root := ""
	if len(*served) > 0 {
		root = *model
	}
	srv := simserver.New(simserver.Config{
		Root:             root,
		APIKeys:          keys,
		LegacyErrors:     *legacyErrors,
		AllowRuntimeLoRA: *allowLoRA,
		GPUCacheMetric:   *gpuCache,
		ShutdownTimeout:  *shutdownTimeout,
	}, eng, log)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sim-server listen: %w", err)
	}
	fmt.Fprintf(stdout, "sim-server listening on http://%s\n", ln.Addr())
	log.Info("serving", "addr", ln.Addr().String(), "models", names, "adapters", len(modules), "runtime_lora", *allowLoRA)
	return srv.Serve(ctx, ln)
}

// envTrue is vLLM's reading of a boolean environment variable.
func envTrue(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	return v == "1" || v == "true"
}

// expandNargs turns argparse's "--flag a b c" (nargs="+") into "--flag a
// --flag b --flag c" for pflag: the values after the first one run up to
// the next argument that starts with "-".
func expandNargs(args []string, flag string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		out = append(out, args[i])
		if args[i] == "--" {
			return append(out, args[i+1:]...)
		}
		if args[i] != flag || i+1 >= len(args) {
			continue
		}
		i++
		out = append(out, args[i])
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			out = append(out, flag, args[i])
		}
	}
	return out
}
