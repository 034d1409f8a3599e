package vllm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// Config sets up the engine. Zero values take the defaults shown; the
// embedded httpengine.Config has the connection, timeouts and child process
// settings (URL, APIKey, Command, Env, StallTimeout...).
//
// Differences from httpengine's defaults: URL defaults to the --host and
// --port of Command, else http://127.0.0.1:8000; HealthPath to "/health".
// Models, if set, replaces the base models /v1/models reports (adapters
// still come from there).
type Config struct {
	httpengine.Config

	// MaxLoras is the adapter slots the engine reports (Stats().MaxLoras),
	// which the worker's adapter manager keeps to. Default: the --max-loras
	// of Command, else vLLM's max_lora from /metrics, else no limit.
	MaxLoras        int
	MetricsInterval time.Duration // /metrics scrape period; default 1s

	// KVEvents is the ZMQ endpoint of vLLM's KV cache events publisher
	// (vllm serve --kv-events-config '{..."publisher":"zmq","endpoint":
	// "tcp://*:5557"...}'), e.g. tcp://127.0.0.1:5557; with it the engine
	// reports what vLLM's prefix cache stored and evicted (engine.KVEventer,
	// kvevents.go). KVEventsAuto with Command adds --kv-events-config to
	// the command on a free port. "": off.
	KVEvents      string
	KVEventsTopic string // the publisher's topic; "": any ("kv-events" with KVEventsAuto)

	// PriorityBands: vLLM runs with --scheduling-policy priority, so each
	// request's "priority" is set from its flow-control band (critical
	// -1000, interactive 0, batch 1000, plus the client's own priority
	// within ±999; request.go), and vLLM's own queue keeps the bands'
	// order. On by itself when Command has that flag.
	PriorityBands bool

	// SleepMode: the worker puts the engine to sleep when idle
	// (engine.Sleeper, sleep.go). With Command, the command must have
	// --enable-sleep-mode and the child gets VLLM_SERVER_DEV_MODE=1.
	// SleepLevel is vLLM's level (default 1: weights to CPU memory);
	// SleepTimeout bounds one sleep or wake-up (default 5m).
	SleepMode    bool
	SleepLevel   int
	SleepTimeout time.Duration

	// KVTransfer: the server has a KV connector (--kv-transfer-config) and
	// takes part in prefill/decode disaggregation (disagg.go); a Command
	// must have the flag.
	KVTransfer bool
}

// EnvRuntimeLoRA is what the child process gets in its environment, so that
// vLLM offers /v1/load_lora_adapter.
const EnvRuntimeLoRA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"

// Engine is a vLLM server as an engine.Engine and engine.Adapters.
type Engine struct {
	core     *httpengine.Engine
	cfg      Config
	adapters loaded
	metrics  atomic.Pointer[Metrics]

	kv *kvEvents // nil: KV events off (kvevents.go)

	// sleptAt is the child's restart count when vLLM was last seen asleep,
	// -1 when awake (sleep.go).
	sleptAt atomic.Int64

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	loops  sync.WaitGroup
}

var (
	_ engine.Engine         = (*Engine)(nil)
	_ engine.Adapters       = (*Engine)(nil)
	_ engine.ContextLengths = (*Engine)(nil)
	_ engine.KVEventer      = (*Engine)(nil)
	_ engine.Sleeper        = (*Engine)(nil)
)

// New starts the engine named "vllm" on cfg (and the child process if
// cfg.Command is set). It does not wait for the server (see WaitReady).
func New(cfg Config) (*Engine, error) {
	if cfg.URL == "" {
		cfg.URL = httpengine.URLFromCommand(cfg.Command, 8000)
	}
	if cfg.HealthPath == "" {
		cfg.HealthPath = "/health"
	}
	if cfg.Command != "" {
		cfg.Env = append([]string{EnvRuntimeLoRA}, cfg.Env...)
		if cfg.MaxLoras == 0 {
			cfg.MaxLoras, _ = strconv.Atoi(httpengine.FlagValue(cfg.Command, "--max-loras"))
		}
		if httpengine.FlagValue(cfg.Command, "--scheduling-policy") == "priority" {
			cfg.PriorityBands = true
		}
	}
	if cfg.MetricsInterval <= 0 {
		cfg.MetricsInterval = time.Second
	}
	if err := sleepConfig(&cfg); err != nil {
		return nil, err
	}
	if err := kvTransferConfig(&cfg); err != nil {
		return nil, err
	}
	kvEndpoint, err := kvEventsConfig(&cfg) // before the child starts: it may add a flag
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, adapters: loaded{names: map[string]struct{}{}}}
	e.sleptAt.Store(-1)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	core, err := httpengine.New("vllm", cfg.Config, httpengine.Hooks{RefreshModels: e.refreshModels})
	if err != nil {
		e.cancel()
		return nil, err
	}
	e.core = core
	if kvEndpoint != "" {
		e.startKVEvents(kvEndpoint)
	}
	e.loops.Add(1)
	go func() { defer e.loops.Done(); e.metricsLoop() }()
	return e, nil
}

// Name is "vllm".
func (e *Engine) Name() string { return e.core.Name() }

// NotifyModels sets f, called when the server's model list changes
// (engine.ModelsNotifier; adapters are the worker's adapter manager's).
func (e *Engine) NotifyModels(f func()) { e.core.NotifyModels(f) }

// URL is the server's root URL.
func (e *Engine) URL() string { return e.core.URL() }

// PID is the child process's id (0 when attached by URL or not running).
func (e *Engine) PID() int { return e.core.PID() }

// Restarts is how many times the child process was started again.
func (e *Engine) Restarts() int { return e.core.Restarts() }

// Generate passes the request through (httpengine.Engine.Generate), with
// what prepare adds (request.go: token ids for a requester that strips
// them, the length of a continuation). An adapter it names is loaded
// beforehand by the worker's adapter manager. With KV events on, its prompt
// is queued for mapping first (never waited for).
func (e *Engine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	req = e.prepare(req)
	e.observe(req)
	return e.core.Generate(ctx, req, sink)
}

// MaxModelLens is vLLM's max_model_len of each base model.
func (e *Engine) MaxModelLens() map[string]int { return e.core.MaxModelLens() }

// Models lists the base models and the loaded adapters.
func (e *Engine) Models() []string {
	ms := e.core.Models()
	for _, a := range e.adapters.list() {
		if !slices.Contains(ms, a) {
			ms = append(ms, a)
		}
	}
	return ms
}

// Stats merges vLLM's /metrics with the engine's own count: Running is the
// larger of the requests this engine has in flight and vLLM's
// num_requests_running (other clients may use the server too, and the
// scrape lags); Waiting and KVCacheUsage are vLLM's. Metrics older than
// five scrape periods (at least 5s) are ignored.
func (e *Engine) Stats() engine.Stats {
	st := engine.Stats{Running: e.core.InFlight(), Adapters: e.adapters.list(), MaxLoras: e.maxLoras()}
	if m := e.freshMetrics(); m != nil {
		st.Running = max(st.Running, m.Running)
		st.Waiting = m.Waiting
		st.KVCacheUsage = m.KVCacheUsage
	}
	return st
}

// Health is the cached verdict of GET /health (no I/O).
func (e *Engine) Health(ctx context.Context) error { return e.core.Health(ctx) }

// WaitReady blocks until /health answers 200 or ctx ends. A server without
// /health (404) is not vLLM: that fails at once, saying so.
func (e *Engine) WaitReady(ctx context.Context) error {
	err := e.core.WaitReady(ctx)
	if errors.Is(err, httpengine.ErrNoHealthPath) && e.cfg.HealthPath == "/health" {
		return fmt.Errorf("%w; every vLLM serves /health, so this server is not vLLM: use --engine openai for another OpenAI-compatible server", err)
	}
	return err
}

// Close ends requests in flight and adapter loads and unloads, and stops the child.
func (e *Engine) Close() error {
	e.cancel()
	e.loops.Wait()
	return e.core.Close()
}

// maxLoras is the adapter cap in force (0: none).
func (e *Engine) maxLoras() int {
	if e.cfg.MaxLoras > 0 {
		return e.cfg.MaxLoras
	}
	if m := e.metrics.Load(); m != nil {
		return m.MaxLora
	}
	return 0
}

// refreshModels is the model refresh hook: base models to the core, adapters
// to the engine's list of loaded adapters.
func (e *Engine) refreshModels(ctx context.Context, core *httpengine.Engine) error {
	v := e.adapters.version()
	ms, err := core.FetchModels(ctx)
	if err != nil {
		return err
	}
	var base []string
	adapters := map[string]struct{}{}
	for _, m := range ms {
		if m.Parent != "" {
			adapters[m.ID] = struct{}{}
		} else {
			base = append(base, m.ID)
		}
	}
	if len(e.cfg.Models) > 0 {
		base = e.cfg.Models
	}
	core.SetModels(base)
	core.SetMaxModelLens(ms)
	e.adapters.sync(adapters, v)
	return nil
}

func sortedKeys[M ~map[K]V, K cmp.Ordered, V any](m M) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
