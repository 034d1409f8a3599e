package program

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
	"github.com/tokenbus/tokenbus/workers/engine/openai"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/vllm"
)

// EngineConfig chooses and configures the engine a worker drives.
type EngineConfig struct {
	Kind      string   // sim (built in, no GPU), vllm or openai (any OpenAI-compatible server)
	Model     string   // sim: the model name it serves
	URL       string   // vllm, openai: the server's URL (vllm: default from VLLMCmd's --port, else :8000)
	VLLMCmd   string   // vllm: start vLLM as a child process with this command line
	APIKey    string   // vllm, openai: sent to the engine as a Bearer token
	RequestID string   // vllm, openai: X-Request-Id to the engine: raw, uuid or off ("": vllm raw, openai uuid)
	Models    []string // openai: the models the server serves (nil: read from its /v1/models)
	MaxLoras  int      // vllm: adapters kept loaded (0: VLLMCmd's --max-loras, else vLLM's own)
	// PriorityBands: vllm runs with --scheduling-policy priority; requests
	// get their band's priority (vllm.Config.PriorityBands).
	PriorityBands bool
	StartTimeout  time.Duration // vllm, openai: how long to wait for the first good health check
	// HealthPath is probed when the engine is idle ("": the engine's
	// default); HealthInterval is how often health is judged, 0: never probe.
	HealthPath     string
	HealthInterval time.Duration
	// KVEvents is the ZMQ endpoint of vLLM's KV cache events publisher, or
	// "auto" with VLLMCmd (vllm.Config.KVEvents); "": none. KVEventsTopic
	// is its topic ("": any).
	KVEvents      string
	KVEventsTopic string
	Sim           sim.Config // sim: latency and capacity (Model is set from Model)

	// VLLMModels: vllm, instead of VLLMCmd: "name=command" per model, one
	// vLLM run at a time, the first at start; the worker switches between
	// them (vllm.Switching, docs/capacity.md).
	VLLMModels []string

	// SleepMode: the worker puts the engine to sleep when idle
	// (workers.Config.SleepAfter; the start functions set it from there).
	// Only sim and vllm (of one model) can sleep: vllm needs vLLM's sleep
	// routes (a VLLMCmd gets VLLM_SERVER_DEV_MODE=1 and must have
	// --enable-sleep-mode), checked at start.
	SleepMode bool

	// KVTransfer: the worker has a disaggregation role (prefill or decode):
	// vllm must have a KV connector (--kv-transfer-config, checked in a
	// command); the sim always speaks the handshake; openai cannot.
	KVTransfer bool
}

// DefaultEngine is the sim serving llama-8b.
func DefaultEngine() EngineConfig {
	return EngineConfig{Kind: "sim", Model: "llama-8b", StartTimeout: 20 * time.Minute, HealthInterval: time.Second, Sim: sim.DefaultConfig()}
}

// Desc is a short description for start-up messages.
func (c EngineConfig) Desc() string {
	if c.Kind == "sim" {
		return "sim"
	}
	return strings.TrimSpace(c.Kind + " " + c.URL)
}

// newEngine builds the engine; for HTTP engines it waits until the server
// answers its health check (ctx and StartTimeout bound the wait).
func newEngine(ctx context.Context, c EngineConfig, log *slog.Logger) (engine.Engine, error) {
	hc := httpengine.Config{URL: c.URL, APIKey: c.APIKey, RequestID: c.RequestID, Models: c.Models, Command: c.VLLMCmd,
		StartTimeout: c.StartTimeout, HealthPath: c.HealthPath, HealthInterval: c.HealthInterval, Logger: log}
	if c.HealthInterval <= 0 {
		hc.HealthInterval = -1 // httpengine's "off"; its 0 is the default
	}
	switch c.Kind {
	case "sim":
		if c.KVEvents != "" {
			return nil, fmt.Errorf("--engine-kv-events goes with --engine vllm (the sim reports its prefix cache by itself)")
		}
		cfg := c.Sim
		cfg.Model = c.Model
		if len(cfg.Models) > 0 {
			cfg.Model = "" // the first of them
		}
		return sim.New(cfg)
	case "vllm":
		if len(c.VLLMModels) > 0 {
			if c.SleepMode {
				return nil, fmt.Errorf("--sleep-after goes with one vLLM (--vllm-cmd or --engine-url), not with --vllm-model")
			}
			return newSwitchingVLLM(ctx, c, hc)
		}
		e, err := vllm.New(vllm.Config{Config: hc, MaxLoras: c.MaxLoras, KVEvents: c.KVEvents, KVEventsTopic: c.KVEventsTopic,
			PriorityBands: c.PriorityBands, SleepMode: c.SleepMode, KVTransfer: c.KVTransfer})
		if err != nil {
			return nil, err
		}
		if err := waitEngine(ctx, e, e.WaitReady, c.StartTimeout); err != nil || !c.SleepMode {
			return e, err
		}
		// The sleep routes exist only with VLLM_SERVER_DEV_MODE=1: say so
		// now, not at the first sleep.
		if _, err := e.RefreshSleeping(ctx); err != nil {
			e.Close()
			return nil, fmt.Errorf("--sleep-after: vLLM at %s cannot sleep: %w", e.URL(), err)
		}
		return e, nil
	case "openai":
		if c.SleepMode {
			return nil, fmt.Errorf("--sleep-after: the openai engine cannot sleep (sim and vllm can)")
		}
		if c.KVEvents != "" {
			return nil, fmt.Errorf("--engine-kv-events goes with --engine vllm")
		}
		if c.VLLMCmd != "" {
			return nil, fmt.Errorf("--vllm-cmd goes with --engine vllm")
		}
		if c.URL == "" {
			return nil, fmt.Errorf("--engine openai needs --engine-url")
		}
		e, err := openai.New(hc)
		if err != nil {
			return nil, err
		}
		return e, waitEngine(ctx, e, e.WaitReady, c.StartTimeout)
	}
	return nil, fmt.Errorf("unknown --engine %q (sim, vllm or openai)", c.Kind)
}

// newSwitchingVLLM is the vllm engine of several models, one vLLM at a time.
func newSwitchingVLLM(ctx context.Context, c EngineConfig, hc httpengine.Config) (engine.Engine, error) {
	if c.VLLMCmd != "" {
		return nil, fmt.Errorf("--vllm-cmd or --vllm-model, not both")
	}
	var models []vllm.ModelCommand
	for _, specs := range c.VLLMModels {
		// TOKENBUS_VLLM_MODEL sets the flag once: one model a line.
		for spec := range strings.Lines(specs) {
			if strings.TrimSpace(spec) == "" {
				continue
			}
			m, err := vllm.ParseModelCommand(spec)
			if err != nil {
				return nil, fmt.Errorf("--vllm-model: %w", err)
			}
			models = append(models, m)
		}
	}
	e, err := vllm.NewSwitching(vllm.Config{Config: hc, MaxLoras: c.MaxLoras, KVEvents: c.KVEvents, KVEventsTopic: c.KVEventsTopic,
		PriorityBands: c.PriorityBands}, models)
	if err != nil {
		return nil, err
	}
	return e, waitEngine(ctx, e, e.WaitReady, c.StartTimeout)
}

// servable is what an engine serves and every model it can switch to
// (engine.Switcher): the models a worker registers.
func servable(e engine.Engine) []string {
	ms := e.Models()
	if sw, ok := e.(engine.Switcher); ok {
		for _, m := range sw.CanServe() {
			if !slices.Contains(ms, m) {
				ms = append(ms, m)
			}
		}
	}
	return ms
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
