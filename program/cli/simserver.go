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

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/program"
)

// runSimServer is `tokenbus sim-server`: the sim engine behind vLLM's own
// OpenAI-compatible HTTP API (package simserver). It takes the vLLM flags
// that mean something to the sim (--host, --port, --served-model-name,
// --max-model-len, --max-loras, --max-num-seqs, --block-size,
// --lora-modules, --api-key), so it can stand in for "vllm serve" in a
// vllm engine's --vllm-cmd.
func runSimServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, lopts, err := simServerConfig(args, stdout)
	if err != nil {
		return err
	}
	log, err := lopts.logger(stderr)
	if err != nil {
		return err
	}
	cfg.Log = log // the program names its component on it
	log = log.With("component", "sim-server")
	lopts.servePprof(log)
	srv, err := program.StartSimServer(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sim-server listening on http://%s\n", srv.Addr())
	if a := srv.KVEventsAddr(); a != "" {
		log.Info("publishing KV cache events", "addr", a)
	}
	log.Info("serving", "addr", srv.Addr(), "models", append([]string{cfg.Sim.Model}, cfg.Sim.ServedNames...),
		"adapters", len(cfg.LoRAModules), "runtime_lora", cfg.AllowRuntimeLoRA)
	return untilDone(ctx, srv, nil)
}

// simServerConfig reads sim-server's flags, vLLM's among them, into a config.
func simServerConfig(args []string, stdout io.Writer) (program.SimServerConfig, logOptions, error) {
	fs := flagenv.NewFlagSet("sim-server")
	cfg := program.DefaultSimServer()
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "listen address")
	host := fs.String("host", "", "vLLM's --host: replaces the host of --listen")
	port := fs.Int("port", 0, "vLLM's --port: replaces the port of --listen")
	model := fs.String("model", cfg.Sim.Model, "served model name (with --served-model-name: only the model's root in /v1/models, as vLLM's model path)")
	served := fs.StringSlice("served-model-name", nil, "vLLM's --served-model-name: the names served instead of --model, the first one in metrics")
	registerSimFlags(fs, &cfg.Sim)
	maxModelLen := fs.Int("max-model-len", 0, "vLLM's name for --sim-max-model-len (0: that flag)")
	maxLoras := fs.Int("max-loras", 0, "vLLM's name for --sim-max-loras (0: that flag)")
	maxNumSeqs := fs.Int("max-num-seqs", 0, "vLLM's name for --sim-max-num-seqs (0: that flag)")
	blockSize := fs.Int("block-size", 0, "vLLM's name for --sim-block-size (0: that flag)")
	maxBatched := fs.Int("max-num-batched-tokens", 0, "prefill tokens admitted per step (0: the sim's default)")
	fs.Bool("enable-lora", true, "accepted for vLLM compatibility: the sim always serves LoRA adapters")
	loraModules := fs.StringArray("lora-modules", nil, "adapters loaded at start, vLLM's syntax: name=path or JSON {\"name\",\"path\"}; repeat the flag or list them after one, space-separated")
	fs.StringSliceVar(&cfg.APIKeys, "api-key", nil, "API keys required as 'Authorization: Bearer' on /v1 paths (default: $VLLM_API_KEY)")
	fs.BoolVar(&cfg.AllowRuntimeLoRA, "allow-runtime-lora", envTrue(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")),
		"offer /v1/load_lora_adapter and /v1/unload_lora_adapter (default: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as vLLM)")
	fs.BoolVar(&cfg.SleepMode, "enable-sleep-mode", false, "vLLM's: the engine may sleep (POST /sleep, /wake_up; with --dev-mode)")
	fs.BoolVar(&cfg.DevMode, "dev-mode", envTrue(os.Getenv("VLLM_SERVER_DEV_MODE")),
		"serve vLLM's development routes the sim has: /sleep, /wake_up, /is_sleeping (default: VLLM_SERVER_DEV_MODE=1, as vLLM)")
	fs.BoolVar(&cfg.LegacyErrors, "legacy-errors", false, "answer errors in vLLM's flat pre-0.10.1 shape {\"object\":\"error\",...}")
	fs.BoolVar(&cfg.GPUCacheMetric, "gpu-cache-metric", false, "also export vllm:gpu_cache_usage_perc (the KV-cache gauge's name before vLLM 0.10)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "on SIGTERM, how long open requests may go on")
	kvTransfer := fs.String("kv-transfer-config", "", `vLLM's KV connector JSON, e.g. '{"kv_connector":"NixlConnector","kv_role":"kv_both"}': accepted for vLLM compatibility, the sim always speaks the KV-transfer handshake (its endpoint: --sim-kv-transfer-addr, else VLLM_NIXL_SIDE_CHANNEL_HOST and _PORT)`)
	fs.StringVar(&cfg.KVEvents, "kv-events-config", "", `vLLM's KV cache events, its JSON: e.g. '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}' publishes the sim's prefix cache stores and evictions in vLLM's format over ZMQ`)
	var lopts logOptions
	lopts.register(fs)
	if err := parse(fs, expandNargs(args, "--lora-modules"), stdout); err != nil {
		return cfg, lopts, err
	}
	if fs.Changed("host") || fs.Changed("port") {
		h, p, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return cfg, lopts, fmt.Errorf("--listen %q: %v", cfg.Listen, err)
		}
		if fs.Changed("host") {
			h = *host
		}
		if fs.Changed("port") {
			p = strconv.Itoa(*port)
		}
		cfg.Listen = net.JoinHostPort(h, p)
	}
	names := []string{*model}
	if len(*served) > 0 {
		names = *served
		cfg.Root = *model
	}
	cfg.Sim.Model, cfg.Sim.ServedNames = names[0], names[1:]
	for _, o := range []struct {
		v   int
		dst *int
	}{{*maxModelLen, &cfg.Sim.MaxModelLen}, {*maxLoras, &cfg.Sim.MaxLoras}, {*maxNumSeqs, &cfg.Sim.MaxNumSeqs},
		{*blockSize, &cfg.Sim.BlockSize}, {*maxBatched, &cfg.Sim.MaxNumBatchedTokens}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if *kvTransfer != "" {
		var kc map[string]any
		if err := json.Unmarshal([]byte(*kvTransfer), &kc); err != nil {
			return cfg, lopts, fmt.Errorf("--kv-transfer-config: not a JSON object: %v", err)
		}
	}
	// vLLM's NixlConnector serves its blocks' side channel there: the sim
	// its KV-transfer endpoint, unless told where.
	if h, p := os.Getenv("VLLM_NIXL_SIDE_CHANNEL_HOST"), os.Getenv("VLLM_NIXL_SIDE_CHANNEL_PORT"); !fs.Changed("sim-kv-transfer-addr") && (h != "" || p != "") {
		if h == "" || h == "localhost" {
			h = "127.0.0.1"
		}
		if p == "" {
			p = "5600" // vLLM's default
		}
		cfg.Sim.KVTransferAddr = net.JoinHostPort(h, p)
	}
	if len(cfg.APIKeys) == 0 && os.Getenv("VLLM_API_KEY") != "" {
		cfg.APIKeys = []string{os.Getenv("VLLM_API_KEY")}
	}
	for _, m := range *loraModules {
		mod, err := loraModule(m)
		if err != nil {
			return cfg, lopts, err
		}
		cfg.LoRAModules = append(cfg.LoRAModules, mod)
	}
	return cfg, lopts, nil
}

// loraModule reads one --lora-modules value: name=path, or vLLM's JSON form.
func loraModule(m string) (program.LoRAModule, error) {
	var mod program.LoRAModule
	if strings.HasPrefix(strings.TrimSpace(m), "{") {
		if err := json.Unmarshal([]byte(m), &mod); err != nil {
			return mod, fmt.Errorf("--lora-modules %s: %v", m, err)
		}
	} else {
		mod.Name, mod.Path, _ = strings.Cut(m, "=")
	}
	if mod.Name == "" || mod.Path == "" {
		return mod, fmt.Errorf("--lora-modules %q: want name=path", m)
	}
	return mod, nil
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
