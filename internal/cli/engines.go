package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
	"github.com/tokenbus/tokenbus/workers/engine/openai"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/vllm"
)

// engineOptions choose and configure the engine a worker drives.
type engineOptions struct {
	kind         string
	model        string
	url          string
	vllmCmd      string
	apiKey       string
	models       []string
	maxLoras     int
	startTimeout time.Duration
	sim          sim.Config
}

func (o *engineOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.kind, "engine", "sim", "engine: sim (built in, no GPU), vllm (a vLLM server) or openai (any OpenAI-compatible server)")
	fs.StringVar(&o.model, "model", "llama-8b", "sim: the model name it serves")
	fs.StringVar(&o.url, "engine-url", "", "vllm/openai: the server's URL, e.g. http://127.0.0.1:8000 (vllm: default from --vllm-cmd's --port, else :8000)")
	fs.StringVar(&o.vllmCmd, "vllm-cmd", "", `vllm: start vLLM as a child process with this command line, e.g. "vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 --enable-lora --max-loras 4"; it is restarted if it dies`)
	fs.StringVar(&o.apiKey, "engine-api-key", "", "vllm/openai: API key sent to the engine as a Bearer token")
	fs.StringSliceVar(&o.models, "engine-models", nil, "openai: model names the server serves (default: read from its /v1/models)")
	fs.IntVar(&o.maxLoras, "max-loras", 0, "vllm: LoRA adapters kept loaded, least recently used evicted first (default: --vllm-cmd's --max-loras, else vLLM's own)")
	fs.DurationVar(&o.startTimeout, "engine-start-timeout", 20*time.Minute, "vllm/openai: how long to wait for the engine's first good health check")
	registerSimFlags(fs, &o.sim)
}

// registerSimFlags defines the sim's latency and capacity flags.
func registerSimFlags(fs *pflag.FlagSet, c *sim.Config) {
	d := sim.DefaultConfig()
	fs.DurationVar(&c.PrefillBase, "sim-prefill-base", d.PrefillBase, "sim: fixed cost of a step that prefills")
	fs.DurationVar(&c.PrefillPerToken, "sim-prefill-per-token", d.PrefillPerToken, "sim: prefill cost per uncached prompt token")
	fs.DurationVar(&c.DecodeBase, "sim-decode-base", d.DecodeBase, "sim: fixed cost of a decode step (about the time per output token)")
	fs.DurationVar(&c.DecodePerSeq, "sim-decode-per-seq", d.DecodePerSeq, "sim: decode step cost per running sequence")
	fs.IntVar(&c.MaxNumSeqs, "sim-max-num-seqs", d.MaxNumSeqs, "sim: max sequences decoded together (vLLM's --max-num-seqs)")
	fs.IntVar(&c.NumBlocks, "sim-kv-blocks", d.NumBlocks, "sim: KV cache size in blocks")
	fs.IntVar(&c.BlockSize, "sim-block-size", d.BlockSize, "sim: tokens per KV cache block")
	fs.IntVar(&c.MaxModelLen, "sim-max-model-len", d.MaxModelLen, "sim: context length")
	fs.IntVar(&c.MaxLoras, "sim-max-loras", d.MaxLoras, "sim: LoRA adapter slots")
	fs.DurationVar(&c.AdapterLoadTime, "sim-lora-load-time", d.AdapterLoadTime, "sim: time to load a LoRA adapter")
}

// newEngine builds the configured engine; for HTTP engines it waits until
// the server answers its health check (ctx bounds the wait).
func (o *engineOptions) newEngine(ctx context.Context, log *slog.Logger) (engine.Engine, error) {
	hc := httpengine.Config{URL: o.url, APIKey: o.apiKey, Models: o.models, Command: o.vllmCmd,
		StartTimeout: o.startTimeout, Logger: log}
	switch o.kind {
	case "sim":
		cfg := o.sim
		cfg.Model = o.model
		return sim.New(cfg)
	case "vllm":
		e, err := vllm.New(vllm.Config{Config: hc, MaxLoras: o.maxLoras})
		if err != nil {
			return nil, err
		}
		return e, waitEngine(ctx, e, e.WaitReady, o.startTimeout)
	case "openai":
		if o.vllmCmd != "" {
			return nil, fmt.Errorf("--vllm-cmd goes with --engine vllm")
		}
		if o.url == "" {
			return nil, fmt.Errorf("--engine openai needs --engine-url")
		}
		e, err := openai.New(hc)
		if err != nil {
			return nil, err
		}
		return e, waitEngine(ctx, e, e.WaitReady, o.startTimeout)
	}
	return nil, fmt.Errorf("unknown --engine %q (sim, vllm or openai)", o.kind)
}

func waitEngine(ctx context.Context, e engine.Engine, wait func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := wait(ctx); err != nil {
		e.Close()
		return fmt.Errorf("engine %s not ready: %w", e.Name(), err)
	}
	return nil
}

// engineDesc is a short description for start-up messages.
func (o *engineOptions) engineDesc() string {
	if o.kind == "sim" {
		return "sim"
	}
	return strings.TrimSpace(o.kind + " " + o.url)
}
