package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Config sets the simulated model and GPU. New fills zero sizes with the
// defaults; zero durations mean "takes no time", so start from DefaultConfig.
type Config struct {
	Model       string   // base model name (default "sim"; with Models, the one loaded at start: default Models[0])
	ServedNames []string // more names for the base model (not with Models)
	// Models are the base models the sim can serve, one loaded at a time
	// (GPU memory holds one): Switch loads another in SwitchTime
	// (switch.go). Empty: it serves Model only.
	Models     []string
	SwitchTime time.Duration // how long Switch takes to load a model (default 500ms)

	MaxModelLen         int // context length, prompt + completion (default 8192)
	MaxNumSeqs          int // sequences in the running batch (default 256)
	MaxNumBatchedTokens int // prefill tokens admitted per step; one sequence always fits (default 8192)
	BlockSize           int // tokens per KV-cache block (default 16)
	NumBlocks           int // KV-cache blocks (default 32768: 256 sequences of 2048 tokens)
	MaxN                int // largest n (default 16)
	MinEOS, MaxEOS      int // natural answer length range, in tokens (default 20..200)

	PrefillBase     time.Duration // fixed cost of a step that prefills (default 15ms)
	PrefillPerToken time.Duration // per prompt token not found in the prefix cache (default 20µs)
	DecodeBase      time.Duration // fixed cost of a decode-only step (default 9ms)
	DecodePerSeq    time.Duration // per sequence decoding in the step (default 20µs)

	MaxLoras        int           // LoRA adapter slots (default 4)
	AdapterLoadTime time.Duration // time LoadAdapter takes (default 50ms)

	// Sleep mode (engine.Sleeper, sleep.go): how long Sleep and WakeUp take
	// (default 50ms and 200ms; vLLM's level 1 moves the weights to CPU
	// memory and back, seconds for a large model).
	SleepTime, WakeTime time.Duration

	EmbeddingDims int // size of the embeddings it serves (default DefaultEmbeddingDims)

	// ReasoningTokens > 0 makes it a reasoning model: a chat answer begins
	// with that many tokens of reasoning_content (reasoning.go); 0: off.
	ReasoningTokens int

	// KVEventBytes is the block size, in bytes of prompt text, of the
	// prefix-cache events it reports (DrainKVEvents): default 64, the
	// dispatchers' default; negative: none.
	KVEventBytes int
	// BlockEvents records the cache's stores and evictions as vLLM's KV
	// cache events name them, for DrainBlockEvents (blockevents.go).
	BlockEvents bool

	// Prefill/decode disaggregation: vLLM's KV-transfer handshake
	// (disagg.go). A prefill's KV blocks are held for a remote decode
	// KVHoldTime at most (0: the default, 30s; vLLM's is
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480s, made for real networks);
	// a decode that takes them waits KVTransferBase +
	// KVTransferPerToken × prompt tokens (default 1ms + 0.5µs a token:
	// 128 KiB of KV a token for an 8B model such as Llama 3 8B, bf16,
	// at about 260 GB/s, NVLink between two GPUs of one host; RDMA
	// between hosts, 400 Gb/s, is about 2.6µs a token). KVTransferAddr
	// is where the engine serves its held blocks to decode engines
	// (kvserver.go), a TCP address listened on at the first prefill
	// (default 127.0.0.1:0: loopback, any port). KVPeers are the hosts
	// (names or addresses, as remote_host says them) besides loopback
	// that a decode may pull blocks from: the params come in a request
	// body, and the sim-server takes bodies from anyone, so no client
	// makes the engine connect where it likes.
	KVHoldTime         time.Duration
	KVTransferBase     time.Duration
	KVTransferPerToken time.Duration
	KVTransferAddr     string
	KVPeers            []string
}

// DefaultConfig is a small model on one GPU: about 15-20 ms to the first
// token of a short prompt and 9-10 ms per output token at low batch sizes.
func DefaultConfig() Config {
	return Config{
		Model:               "sim",
		MaxModelLen:         8192,
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		BlockSize:           16,
		NumBlocks:           256 * 2048 / 16,
		MaxN:                16,
		MinEOS:              20,
		MaxEOS:              200,
		PrefillBase:         15 * time.Millisecond,
		PrefillPerToken:     20 * time.Microsecond,
		DecodeBase:          9 * time.Millisecond,
		DecodePerSeq:        20 * time.Microsecond,
		MaxLoras:            4,
		AdapterLoadTime:     50 * time.Millisecond,
		SwitchTime:          500 * time.Millisecond,
		SleepTime:           50 * time.Millisecond,
		WakeTime:            200 * time.Millisecond,
		EmbeddingDims:       DefaultEmbeddingDims,
		KVHoldTime:          DefaultKVHoldTime,
		KVTransferBase:      time.Millisecond,
		KVTransferPerToken:  500 * time.Nanosecond,
		KVTransferAddr:      DefaultKVTransferAddr,
	}
}

// Metrics are cumulative counters, named after vLLM's Prometheus metrics.
type Metrics struct {
	PromptTokens       uint64            // vllm:prompt_tokens_total
	GenerationTokens   uint64            // vllm:generation_tokens_total
	PrefixCacheQueries uint64            // vllm:prefix_cache_queries_total (tokens)
	PrefixCacheHits    uint64            // vllm:prefix_cache_hits_total (tokens)
	Preemptions        uint64            // vllm:num_preemptions_total
	RequestSuccess     map[string]uint64 // vllm:request_success_total by finished_reason: stop, length, abort (per sequence)
	Steps              uint64            // engine steps run
}

// Engine is the sim engine. It implements engine.Engine, engine.Adapters,
// engine.ContextLengths, engine.Switcher, engine.Sleeper and
// engine.KVTransferer.
type Engine struct {
	cfg      Config
	cur      atomic.Pointer[loaded] // the base model served now (switch.go)
	switchMu sync.Mutex             // one Switch at a time

	// Tells the worker of adapter loads and unloads, the only changes to
	// the sim's model list (engine.ModelsNotifier).
	engine.ModelsNotice

	mu       sync.Mutex
	incoming []*seq // submitted, not yet taken by the scheduler
	spare    []*seq // the scheduler's: incoming's next backing array
	adapters map[string]*adapter
	closed   bool
	// Sleep mode (sleep.go): asleep from the start of Sleep to the end of
	// WakeUp; active counts the requests past that check, which Sleep
	// waits for none of: it refuses while there are any.
	asleep  bool
	active  int
	sleepMu sync.Mutex                    // one Sleep or WakeUp at a time
	resetKV atomic.Pointer[chan struct{}] // the scheduler drops its prefix cache, then closes it (a sleep frees the KV cache)

	wake chan struct{} // capacity 1: there is something for the scheduler
	quit chan struct{}
	exit chan struct{} // closed when the scheduler is gone

	nRunning, nWaiting atomic.Int64
	abortsPending      atomic.Int64
	kvUsage            atomic.Uint64 // float64 bits
	nextID             atomic.Uint64

	mPrompt, mGen, mQueries, mHits, mPreempt, mSteps atomic.Uint64
	// noSteps counts the scheduler's turns that admitted nothing with
	// sequences waiting (held KV blocks): each must be followed by a
	// sleep until something changes, not by another turn at once.
	noSteps                atomic.Uint64
	mStop, mLength, mAbort atomic.Uint64

	kvx kvTransfer // prefill/decode disaggregation (disagg.go, kvserver.go)

	// owned by the scheduler goroutine
	waiting []*seq
	wHead   int
	running []*seq
	kv      *kvCache
	kvEv    kvEvents    // what the prefix cache stored and evicted (kvevents.go)
	blockEv blockEvents // the same as vLLM names it (blockevents.go), with Config.BlockEvents
	touched []*request
	step    uint64
	lastEnd time.Time
	timer   *time.Timer
}

type adapter struct {
	path  string
	ready bool
}

var (
	_ engine.Engine         = (*Engine)(nil)
	_ engine.Adapters       = (*Engine)(nil)
	_ engine.ContextLengths = (*Engine)(nil)
	_ engine.Switcher       = (*Engine)(nil)
	_ engine.Sleeper        = (*Engine)(nil)
	_ engine.KVTransferer   = (*Engine)(nil)
)

// New checks cfg, fills its zero sizes with defaults and starts the scheduler.
func New(cfg Config) (*Engine, error) {
	d := DefaultConfig()
	if err := checkModels(&cfg); err != nil {
		return nil, err
	}
	if cfg.Model == "" {
		cfg.Model = d.Model
	}
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&cfg.MaxModelLen, d.MaxModelLen}, {&cfg.MaxNumSeqs, d.MaxNumSeqs},
		{&cfg.MaxNumBatchedTokens, d.MaxNumBatchedTokens}, {&cfg.BlockSize, d.BlockSize},
		{&cfg.NumBlocks, d.NumBlocks}, {&cfg.MaxN, d.MaxN}, {&cfg.MinEOS, d.MinEOS},
		{&cfg.MaxEOS, max(d.MaxEOS, cfg.MinEOS)}, {&cfg.MaxLoras, d.MaxLoras}, {&cfg.EmbeddingDims, d.EmbeddingDims},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 0 {
			return nil, fmt.Errorf("sim: negative size in config")
		}
	}
	if cfg.ReasoningTokens < 0 {
		return nil, fmt.Errorf("sim: negative ReasoningTokens")
	}
	switch {
	case cfg.KVEventBytes == 0:
		cfg.KVEventBytes = 64
	case cfg.KVEventBytes > 0 && cfg.KVEventBytes < 8:
		return nil, fmt.Errorf("sim: KVEventBytes %d < 8", cfg.KVEventBytes)
	}
	if cfg.PrefillBase < 0 || cfg.PrefillPerToken < 0 || cfg.DecodeBase < 0 || cfg.DecodePerSeq < 0 || cfg.AdapterLoadTime < 0 ||
		cfg.SwitchTime < 0 || cfg.SleepTime < 0 || cfg.WakeTime < 0 || cfg.KVHoldTime < 0 || cfg.KVTransferBase < 0 ||
		cfg.KVTransferPerToken < 0 {
		return nil, fmt.Errorf("sim: negative duration in config")
	}
	if err := checkKVTransfer(&cfg); err != nil {
		return nil, err
	}
	if cfg.MaxEOS < cfg.MinEOS {
		return nil, fmt.Errorf("sim: MaxEOS %d < MinEOS %d", cfg.MaxEOS, cfg.MinEOS)
	}
	if cfg.NumBlocks*cfg.BlockSize < cfg.MaxModelLen+1 {
		return nil, fmt.Errorf("sim: a KV cache of %d blocks of %d tokens cannot hold one sequence of MaxModelLen %d",
			cfg.NumBlocks, cfg.BlockSize, cfg.MaxModelLen)
	}
	e := &Engine{
		cfg:      cfg,
		adapters: map[string]*adapter{},
		wake:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		exit:     make(chan struct{}),
		kv:       newKVCache(cfg.NumBlocks),
		timer:    time.NewTimer(time.Hour),
	}
	e.timer.Stop()
	e.kv.evicted = &e.kvEv.removing
	if cfg.BlockEvents {
		e.kv.evictedHash = &e.blockEv.removing
	}
	e.cur.Store(e.newLoaded(cfg.Model))
	e.kvx.init()
	e.nextID.Store(uint64(time.Now().UnixNano()))
	codec() // load the vocabulary now rather than in the first request
	go e.run()
	return e, nil
}

// Config returns the configuration in use, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

func (e *Engine) Name() string { return "sim" }

// Models lists the base model loaded, its other names and the loaded
// adapters.
func (e *Engine) Models() []string {
	return append(slices.Clone(e.cur.Load().list), e.adapterNames()...)
}

// MaxModelLens is the configured context length of the base model under
// each of its names.
func (e *Engine) MaxModelLens() map[string]int { return e.cur.Load().lens }

// Adapters maps the loaded adapters to the paths they were loaded from.
func (e *Engine) Adapters() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := make(map[string]string, len(e.adapters))
	for n, a := range e.adapters {
		if a.ready {
			m[n] = a.path
		}
	}
	return m
}

func (e *Engine) adapterNames() []string {
	e.mu.Lock()
	names := make([]string, 0, len(e.adapters))
	for n, a := range e.adapters {
		if a.ready {
			names = append(names, n)
		}
	}
	e.mu.Unlock()
	slices.Sort(names)
	return names
}

func (e *Engine) Stats() engine.Stats {
	return engine.Stats{
		Running:      int(max(e.nRunning.Load(), 0)),
		Waiting:      int(max(e.nWaiting.Load(), 0)),
		KVCacheUsage: math.Float64frombits(e.kvUsage.Load()),
		KVTokens:     e.cfg.NumBlocks * e.cfg.BlockSize,
		Adapters:     e.adapterNames(),
		MaxLoras:     e.cfg.MaxLoras,
	}
}

// Metrics returns the cumulative counters.
func (e *Engine) Metrics() Metrics {
	return Metrics{
		PromptTokens:       e.mPrompt.Load(),
		GenerationTokens:   e.mGen.Load(),
		PrefixCacheQueries: e.mQueries.Load(),
		PrefixCacheHits:    e.mHits.Load(),
		Preemptions:        e.mPreempt.Load(),
		Steps:              e.mSteps.Load(),
		RequestSuccess: map[string]uint64{
			"stop":   e.mStop.Load(),
			"length": e.mLength.Load(),
			"abort":  e.mAbort.Load(),
		},
	}
}

func (e *Engine) errClosed() *schemas.Error {
	return schemas.ErrShuttingDown.New("sim engine")
}

// Health is nil until Close.
func (e *Engine) Health(ctx context.Context) error {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return schemas.ErrEngineUnhealthy.New("sim", "this worker", "shut down")
	}
	return nil
}

// Close stops the scheduler; requests still queued or running fail with a 503.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.exit
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.kvx.close() // decode engines are refused from now on
	close(e.quit)
	<-e.exit
	return nil
}

// resolve maps the requested model to an adapter name ("" for the base
// model) and the adapter's salt: what it mixes into the seed of its output.
func (e *Engine) resolve(model string) (string, uint64, error) {
	if model == "" || e.cur.Load().names[model] {
		return "", 0, nil
	}
	e.mu.Lock()
	a := e.adapters[model]
	e.mu.Unlock()
	if a == nil || !a.ready {
		return "", 0, schemas.ErrModelNotFound.New(model)
	}
	return model, adapterSalt(a.path, model), nil
}

// adapterSalt stands for an adapter's weights: its output is drawn from the
// seed mixed with it, so an adapter answers differently from its base model
// and from other adapters, and the same for the same prompt on every worker
// that loads it (a migrated stream goes on exactly). The weights are named by
// the path (two names for one path answer alike, as on a real engine), else
// by the adapter's name.
func adapterSalt(path, name string) uint64 {
	if path == "" {
		path = name
	}
	return schemas.StringHash("lora-weights:" + path)
}

// Accepter is an optional interface of a Sink. Generate calls Accepted once
// the request has passed validation, before it is queued and before any
// Chunks call, from Generate's goroutine: an HTTP server can send its
// response headers then, as vLLM does, rather than wait for the first token
// (a request may queue for long). An error after Accepted (the engine shut
// down) is a mid-stream error.
type Accepter interface {
	Accepted()
}

// Generate runs one request to its end; see the package comment.
func (e *Engine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	// Tokenizing needs no weights: a sleeping vLLM serves it.
	if req.Kind != schemas.KindTokenize && req.Kind != schemas.KindDetokenize {
		if err := e.enter(); err != nil {
			return nil, err
		}
		defer e.leave()
	}
	if !req.Kind.Generates() && req.Kind.Valid() {
		e.mu.Lock()
		closed := e.closed
		e.mu.Unlock()
		if closed {
			return nil, e.errClosed()
		}
		return e.answer(ctx, req)
	}
	r, err := e.newRequest(ctx, req, sink)
	if err != nil {
		return nil, err
	}
	if r.kv != nil {
		if err := e.beginTransfer(ctx, r); err != nil { // disagg.go
			return nil, err
		}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, e.errClosed()
	}
	e.nWaiting.Add(int64(len(r.seqs)))
	for i := range r.seqs {
		e.incoming = append(e.incoming, &r.seqs[i])
	}
	// Accepted once the request is counted as waiting (a client that has
	// the headers sees it in Stats), and before the scheduler, which takes
	// e.mu, can give it a token.
	if a, ok := sink.(Accepter); ok {
		a.Accepted()
	}
	e.mu.Unlock()
	e.signal()
	stop := context.AfterFunc(ctx, r.abort)
	<-r.done
	stop()
	if r.err != nil {
		return nil, r.err
	}
	return &engine.Result{Usage: r.usage, Response: r.response}, nil
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// LoadAdapter loads a LoRA adapter into a free slot, taking AdapterLoadTime.
// With every slot in use it fails with an error that matches
// ErrNoAdapterSlot (errors.Is) and is a 409 *schemas.Error (errors.As); the
// caller unloads an adapter and tries again.
func (e *Engine) LoadAdapter(ctx context.Context, name, path string) error {
	if name == "" {
		return schemas.ErrAdapterName.At("lora_name")
	}
	if e.cur.Load().names[name] {
		return schemas.ErrAdapterIsBase.At("lora_name", name)
	}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return e.errClosed()
	case e.adapters[name] != nil:
		e.mu.Unlock()
		return schemas.ErrAdapterLoaded.At("lora_name", name)
	case len(e.adapters) >= e.cfg.MaxLoras:
		e.mu.Unlock()
		return &slotsFullError{max: e.cfg.MaxLoras}
	}
	a := &adapter{path: path}
	e.adapters[name] = a
	e.mu.Unlock()

	if err := sleepCtx(ctx, e.cfg.AdapterLoadTime); err != nil {
		e.mu.Lock()
		delete(e.adapters, name)
		e.mu.Unlock()
		return err
	}
	e.mu.Lock()
	a.ready = true
	e.mu.Unlock()
	e.ModelsChanged()
	return nil
}

// UnloadAdapter frees an adapter's slot. Requests already running on it finish.
func (e *Engine) UnloadAdapter(ctx context.Context, name string) error {
	e.mu.Lock()
	if a := e.adapters[name]; a == nil || !a.ready {
		e.mu.Unlock()
		return schemas.ErrAdapterNotFound.At("lora_name", name)
	}
	delete(e.adapters, name)
	e.mu.Unlock()
	e.ModelsChanged()
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrNoAdapterSlot is matched by LoadAdapter's error when all slots are used.
var ErrNoAdapterSlot = errors.New("sim: all LoRA adapter slots are in use")

type slotsFullError struct{ max int }

func (e *slotsFullError) Error() string {
	return fmt.Sprintf("sim: all %d LoRA adapter slots are in use", e.max)
}

func (e *slotsFullError) Is(target error) bool { return target == ErrNoAdapterSlot }

func (e *slotsFullError) As(target any) bool {
	if p, ok := target.(**schemas.Error); ok {
		*p = schemas.ErrAdapterSlotsFull.New(e.max)
		return true
	}
	return false
}
