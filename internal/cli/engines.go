package cli

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// engineOptions choose and configure the engine a worker drives.
type engineOptions struct {
	kind  string
	model string
	sim   sim.Config
}

func (o *engineOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.kind, "engine", "sim", "engine: sim")
	fs.StringVar(&o.model, "model", "llama-8b", "model name the engine serves (sim: any name)")
	registerSimFlags(fs, &o.sim)
}

// registerSimFlags registers the --sim-* flags, which set c.
func registerSimFlags(fs *pflag.FlagSet, c *sim.Config) {
	d := sim.DefaultConfig()
	fs.DurationVar(&c.PrefillBase, "sim-prefill-base", d.PrefillBase, "sim: fixed cost of a prefill step")
	fs.DurationVar(&c.PrefillPerToken, "sim-prefill-per-token", d.PrefillPerToken, "sim: prefill cost per uncached prompt token")
	fs.DurationVar(&c.DecodeBase, "sim-decode-base", d.DecodeBase, "sim: fixed cost of a decode step")
	fs.DurationVar(&c.DecodePerSeq, "sim-decode-per-seq", d.DecodePerSeq, "sim: decode step cost per running sequence")
	fs.IntVar(&c.MaxNumSeqs, "sim-max-num-seqs", d.MaxNumSeqs, "sim: max sequences decoded together (vLLM's --max-num-seqs)")
	fs.IntVar(&c.NumBlocks, "sim-kv-blocks", d.NumBlocks, "sim: KV cache size in blocks")
	fs.IntVar(&c.BlockSize, "sim-block-size", d.BlockSize, "sim: tokens per KV cache block")
	fs.IntVar(&c.MaxModelLen, "sim-max-model-len", d.MaxModelLen, "sim: context length")
	fs.IntVar(&c.MaxLoras, "sim-max-loras", d.MaxLoras, "sim: LoRA adapter slots")
	fs.DurationVar(&c.AdapterLoadTime, "sim-lora-load-time", d.AdapterLoadTime, "sim: time to load a LoRA adapter")
}

// simLatencyZero reports whether every sim latency is zero (throughput mode).
func (o *engineOptions) newEngine(model string) (engine.Engine, error) {
	switch o.kind {
	case "sim":
		cfg := o.sim
		cfg.Model = model
		return sim.New(cfg)
	}
	return nil, fmt.Errorf("unknown --engine %q", o.kind)
}

var _ = time.Second
