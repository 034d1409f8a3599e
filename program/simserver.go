package program

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// SimServerConfig configures the sim-server program: the sim engine behind
// vLLM's own OpenAI-compatible HTTP API (package simserver).
type SimServerConfig struct {
	Listen string
	// Sim is the engine: Model is the first served name (metrics' model_name),
	// ServedNames the others.
	Sim  sim.Config
	Root string // the base model's root in /v1/models ("" : Sim.Model), as vLLM's model path
	// LoRAModules are loaded before the server listens.
	LoRAModules      []LoRAModule
	APIKeys          []string // required as 'Authorization: Bearer' on /v1 paths; none: no check
	AllowRuntimeLoRA bool     // offer /v1/load_lora_adapter and /v1/unload_lora_adapter
	LegacyErrors     bool     // errors in vLLM's flat pre-0.10.1 shape
	GPUCacheMetric   bool     // also export vllm:gpu_cache_usage_perc
	DevMode          bool     // serve vLLM's dev routes the sim has: /sleep, /wake_up, /is_sleeping (VLLM_SERVER_DEV_MODE=1)
	SleepMode        bool     // the engine may sleep (vLLM's --enable-sleep-mode)
	ShutdownTimeout  time.Duration
	// KVEvents is vLLM's --kv-events-config JSON: with events enabled, the
	// sim's prefix cache stores and evictions are published in vLLM's
	// format over ZMQ (simserver.KVPublisher). "": none.
	KVEvents string
	Log      *slog.Logger // gets the server's lines, with component=sim-server: give it none of its own
}

// LoRAModule is an adapter the sim-server loads at start.
type LoRAModule struct{ Name, Path string }

// DefaultSimServer is `tokenbus sim-server` with no flags.
func DefaultSimServer() SimServerConfig {
	cfg := SimServerConfig{Listen: "127.0.0.1:8000", Sim: sim.DefaultConfig(), ShutdownTimeout: 5 * time.Second}
	cfg.Sim.Model = "llama-8b"
	return cfg
}

// SimServer is a running sim-server program.
type SimServer struct {
	*life
	eng *sim.Engine
	ln  net.Listener
	kv  *simserver.KVPublisher // nil: no KV events
}

// StartSimServer starts the sim engine, loads the LoRA modules and serves.
func StartSimServer(ctx context.Context, cfg SimServerConfig) (*SimServer, error) {
	p := &SimServer{life: newLife()}
	err := p.start(ctx, cfg)
	if err := p.begin(err, func() {}, p.release); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *SimServer) start(ctx context.Context, cfg SimServerConfig) error {
	var kc simserver.KVEventsConfig
	kvOn := false
	if cfg.KVEvents != "" {
		var err error
		if kc, kvOn, err = simserver.ParseKVEventsConfig(cfg.KVEvents); err != nil {
			return err
		}
		cfg.Sim.BlockEvents = kvOn
	}
	var err error
	if p.eng, err = sim.New(cfg.Sim); err != nil {
		return err
	}
	for _, m := range cfg.LoRAModules {
		if err := p.eng.LoadAdapter(ctx, m.Name, m.Path); err != nil {
			return fmt.Errorf("--lora-modules %s=%s: %v", m.Name, m.Path, err)
		}
	}
	srv := simserver.New(simserver.Config{
		Root:             cfg.Root,
		APIKeys:          cfg.APIKeys,
		LegacyErrors:     cfg.LegacyErrors,
		AllowRuntimeLoRA: cfg.AllowRuntimeLoRA,
		GPUCacheMetric:   cfg.GPUCacheMetric,
		DevMode:          cfg.DevMode,
		SleepMode:        cfg.SleepMode,
		ShutdownTimeout:  cfg.ShutdownTimeout,
	}, p.eng, componentLog(cfg.Log, "sim-server"))
	if p.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("sim-server listen: %w", err)
	}
	if kvOn {
		if p.kv, err = simserver.NewKVPublisher(kc, p.eng, componentLog(cfg.Log, "sim-server")); err != nil {
			return err
		}
		p.part("kv-events", func() error { return p.kv.Run(p.ctx) })
	}
	// Serve ends, within ShutdownTimeout, once the program's context does.
	p.part("sim-server", func() error { return srv.Serve(p.ctx, p.ln) })
	return nil
}

func (p *SimServer) release() {
	if p.eng != nil {
		p.eng.Close()
	}
}

// KVEventsAddr is the address the KV events publisher is bound to ("": none, or dialled).
func (p *SimServer) KVEventsAddr() string {
	if p.kv == nil {
		return ""
	}
	return p.kv.Addr()
}

// Addr is the bound address (host:port).
func (p *SimServer) Addr() string { return p.ln.Addr().String() }
