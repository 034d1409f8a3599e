package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Request is one OpenAI request as the worker hands it to an engine.
type Request struct {
	ID    string       // tokenbus request id
	Kind  schemas.Kind // chat, completion, embedding, tokenize or detokenize
	Model string       // the model the client named (a base model or an adapter)
	Body  []byte       // the client's JSON, byte for byte; unknown fields must survive
	// View is Body as schemas.ReadRequest read it: the worker reads each
	// body once and engines decide on the view, never on a reading of their
	// own. Nil only when an engine is called directly (tests); engines then
	// read Body with schemas.ReadRequest themselves.
	View        *schemas.Request
	Deadline    time.Time // zero: none
	TraceParent string    // W3C trace context, to pass on to HTTP engines
	// Resume is the number of completion tokens a failed worker already
	// streamed for this request (schemas.HdrResume); the body is their
	// continuation. An engine that can continue exactly (the sim: its output
	// resumes at that position of its deterministic sequence) uses it; the
	// others ignore it (the body is a text continuation).
	Resume int
	// TokenIDs: the requester takes token ids in the chunks of a stream
	// that did not ask for them, and strips them (schemas.HdrTokenIDs). An
	// engine that can return them (vllm: return_token_ids) asks for them;
	// the others ignore it.
	TokenIDs bool
	// Band is the request's flow-control band (schemas.HdrBand; 0: none
	// said). An engine that schedules by priority (vllm with PriorityBands)
	// passes it on; the others ignore it.
	Band schemas.Band
}

// Sink receives a request's output. An engine calls it from one goroutine at
// a time per request.
type Sink interface {
	// Chunks hands over one or more complete OpenAI chunk objects (exactly the
	// JSON that follows "data: " in SSE), separated by '\n', for a streaming
	// request. They are published as one message, so an engine should pass
	// everything it has ready in one call, and must never hold back the first.
	// The engine may reuse b once Chunks returns. An error means the request is
	// gone (cancelled, client lost): stop generating.
	Chunks(b []byte) error
}

// Result is what a finished request leaves.
type Result struct {
	Usage schemas.Usage
	// UsageEstimated: the engine did not report Usage and estimated it (an
	// HTTP engine's stream without a usage chunk counts one completion token
	// per chunk and leaves the prompt at 0). Spans mark such counts.
	UsageEstimated bool
	// Response is the whole OpenAI response object for stream:false, nil for streams.
	Response []byte
}

// Engine runs requests. Generate blocks until the request is finished,
// cancelled (ctx) or failed; errors a client should see are *schemas.Error
// (a 400 for a bad field, a 503 for an engine that is down...), anything else
// becomes a 500.
type Engine interface {
	Name() string
	Generate(ctx context.Context, req *Request, sink Sink) (*Result, error)
	// Models lists what the engine serves now: base models and loaded adapters.
	Models() []string
	Stats() Stats
	// Health returns nil when the engine can take requests.
	Health(ctx context.Context) error
	Close() error
}

// ModelsNotifier is implemented by engines that tell when their served
// models change (an HTTP engine re-reads the server's list; an adapter is
// loaded or unloaded): NotifyModels sets f, called after each change, so
// that the worker heartbeats at once instead of polling Models. f must not
// block. An engine gets it by embedding ModelsNotice.
type ModelsNotifier interface {
	NotifyModels(f func())
}

// ModelsNotice implements ModelsNotifier for an engine that embeds it and
// calls ModelsChanged after each change of its model list.
type ModelsNotice struct{ f atomic.Pointer[func()] }

// NotifyModels sets f, called by ModelsChanged (ModelsNotifier).
func (n *ModelsNotice) NotifyModels(f func()) { n.f.Store(&f) }

// ModelsChanged calls the function NotifyModels set, if any.
func (n *ModelsNotice) ModelsChanged() {
	if f := n.f.Load(); f != nil {
		(*f)()
	}
}

// ContextLengths is implemented by engines that know their base models'
// context lengths (prompt + completion, in tokens): vLLM's max_model_len
// from its /v1/models, the sim's configured one. Workers advertise them in
// heartbeats for /v1/models. A model the engine does not know is left out;
// the map is the engine's to keep: callers must not change it.
type ContextLengths interface {
	MaxModelLens() map[string]int
}

// Stats is an engine's load, as heartbeats advertise it.
type Stats struct {
	Running      int      // sequences being decoded
	Waiting      int      // sequences queued inside the engine
	KVCacheUsage float64  // 0..1
	KVTokens     int      // KV cache size in tokens (blocks × block size); 0: unknown
	Adapters     []string // LoRA adapters loaded now, sorted
	MaxLoras     int      // adapter slots; 0: no limit (or unknown)
}

// KVEventer is implemented by engines that report what their prefix cache
// stored and evicted (the sim; vLLM, whose DrainKVEvents has nothing unless
// its Config.KVEvents is set), named as dispatchers name prompt blocks
// (schemas.PromptBlockHashes). The worker publishes what DrainKVEvents
// returns on schemas.KVEventsSubject, filling in Worker and Seq; ok is false
// when there is nothing new.
type KVEventer interface {
	// KVEventsOn reports whether the engine reports KV events at all (the
	// sim unless told not to, vLLM with Config.KVEvents): a worker polls
	// DrainKVEvents only then, not every 50 ms of an idle process's life.
	KVEventsOn() bool
	DrainKVEvents() (ev schemas.KVEvents, ok bool)
}

// KVEventStatser is implemented by engines that read their KV events from
// elsewhere (vLLM's ZMQ publisher) and map them; the worker exports the
// counts as metrics. All are cumulative.
type KVEventStatser interface {
	KVEventStats() KVEventStats
}

// KVEventStats counts an engine's KV events as read and mapped.
type KVEventStats struct {
	Received     uint64 // messages read from the publisher
	DecodeErrors uint64 // messages not read (bad frames or payload)
	Unknown      uint64 // events of a kind not known, skipped
	Skipped      uint64 // events of another medium or KV cache group, skipped
	Connects     uint64 // connections made to the publisher
	Lost         uint64 // times events were lost (sequence gap, reconnect, cache cleared): reported as Dropped
	// Blocks stored that named a block of a prompt mapped to text, or did
	// not (a prompt not tokenized yet or dropped, generated tokens, a parent
	// unknown).
	Mapped, Unmapped uint64
	// Prompts sent to the engine's tokenizer, failed there, dropped with
	// the queue full, or skipped as mapped recently.
	TokenizeCalls, TokenizeErrors, TokenizeDropped, TokenizeKnown uint64
}

// Adapters is implemented by engines that can load LoRA adapters at run
// time. These are primitives: one call does one load or unload, bounded by
// ctx. Deciding what to load, coalescing, eviction and what to do when the
// slots are full is the worker's adapter manager's (workers/lora), for every
// engine, from Stats().Adapters and Stats().MaxLoras, so Stats must list an
// adapter as soon as LoadAdapter returns nil for it and stop as soon as
// UnloadAdapter does. A load of an adapter already loaded may fail, and an
// unload of one not loaded may fail with a 404 *schemas.Error: the manager
// checks Stats().Adapters.
type Adapters interface {
	LoadAdapter(ctx context.Context, name, path string) error
	UnloadAdapter(ctx context.Context, name string) error
}

// Switcher is implemented by engines that can serve several base models,
// one loaded at a time (GPU memory holds one): Models lists the loaded one
// (and its adapters), CanServe every one Switch can load. Switch replaces
// the loaded model, blocking until the new one serves (bounded by ctx); the
// worker calls it once no request runs (docs/capacity.md). A switch to the
// loaded model does nothing. An engine that cannot load the new model
// leaves what it can serving and says so in its error.
type Switcher interface {
	CanServe() []string
	Switch(ctx context.Context, model string) error
}

// Sleeper is implemented by engines that can free their accelerator's memory
// while idle and take it back later, faster than a cold start: vLLM's sleep
// mode (level 1: weights to CPU memory, KV cache dropped), the sim's
// imitation of it. A worker started with a sleep delay puts an idle engine
// to sleep and wakes it when a request arrives (workers/sleep.go,
// docs/capacity.md#sleeping-engines): a GPU that serves nobody is lent to
// others without a worker to start again. These are primitives, bounded by
// ctx: when to sleep, and who waits for a wake-up, is the worker's. An
// asleep engine must not be sent requests: it may fail them or, worse for
// vLLM, crash on them; the worker never does.
type Sleeper interface {
	// Sleep frees the engine's memory; nothing may run on it (the worker
	// sleeps only an idle engine). Sleeping an asleep engine is no error.
	Sleep(ctx context.Context) error
	// WakeUp brings it back; when it returns nil the engine serves again.
	// Waking an awake engine is no error.
	WakeUp(ctx context.Context) error
	// Sleeping reports whether the engine is asleep (or falling asleep,
	// or waking up): the engine's own last word, no I/O.
	Sleeping() bool
}

// KVTransferer is implemented by engines that speak vLLM's KV-transfer
// handshake (docs/disaggregation.md): given "kv_transfer_params" with
// do_remote_decode, a non-streaming request with max_tokens 1 is a prefill
// whose answer carries the params a decode engine needs (Result.Response's
// "kv_transfer_params"); given the params of such an answer, a request
// skips its prefill and takes the prompt's KV blocks from the prefill
// engine, or fails with schemas.ErrKVTransferFailed before its first chunk
// when it cannot (the worker then runs it again with its own prefill). The
// worker gives such requests only to an engine whose KVTransfer is true
// (the sim always; vLLM when its server runs with a KV connector).
type KVTransferer interface {
	KVTransfer() bool
}
