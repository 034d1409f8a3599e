package vllm

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/internal/freeport"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// KV cache events: with Config.KVEvents set the engine subscribes to vLLM's
// KV events (kvsub.go), and for each chat or completion request with a full
// text block it asks vLLM for the prompt's token ids (POST /tokenize, off
// the request's path: a bounded queue and one goroutine, dropped when full)
// so that the events, which name token blocks, can be turned into the text
// block hashes dispatchers route by (kvmap.go). DrainKVEvents hands them to
// the worker (engine.KVEventer).

// KVEventsAuto as Config.KVEvents with Command: the engine adds
// --kv-events-config to vLLM's command line, publishing on a free local
// port, unless the command has one (then its endpoint is used).
const KVEventsAuto = "auto"

const (
	kvQueueLen        = 64 // prompts waiting for /tokenize
	kvTokenizeTimeout = 5 * time.Second
	kvBlockBytes      = 64 // text per hashed block: the dispatchers' --prefix-block-bytes default, as the sim's
)

// kvEvents is the engine's KV events state; nil when Config.KVEvents is "".
type kvEvents struct {
	m     *kvMap
	sub   *kvSub
	queue chan kvJob

	tokenizeCalls, tokenizeErrors, tokenizeDropped, tokenizeKnown atomic.Uint64
}

// kvJob is a prompt to map: the request's kind, model and body (a copy).
type kvJob struct {
	kind  schemas.Kind
	model string
	lora  string
	body  []byte
}

// kvEventsConfig resolves Config.KVEvents (and KVEventsAuto: the flag added
// to the command) into the endpoint to subscribe to; "" when off.
func kvEventsConfig(cfg *Config) (endpoint string, err error) {
	ep := cfg.KVEvents
	if ep != KVEventsAuto {
		return ep, nil
	}
	if cfg.Command == "" {
		return "", fmt.Errorf("--engine-kv-events auto needs --vllm-cmd (else give the publisher's endpoint, e.g. tcp://127.0.0.1:5557)")
	}
	if v := httpengine.FlagValue(cfg.Command, "--kv-events-config"); v != "" {
		var kc struct {
			Endpoint string `json:"endpoint"`
			Topic    string `json:"topic"`
		}
		if json.Unmarshal([]byte(v), &kc) != nil || kc.Endpoint == "" {
			return "", fmt.Errorf("--engine-kv-events auto: --vllm-cmd's --kv-events-config %q is not one JSON word with an endpoint: give --engine-kv-events the endpoint", v)
		}
		if cfg.KVEventsTopic == "" {
			cfg.KVEventsTopic = kc.Topic
		}
		return connectable(kc.Endpoint), nil
	}
	port, err := freeport.TCP()
	if err != nil {
		return "", err
	}
	if cfg.KVEventsTopic == "" {
		cfg.KVEventsTopic = "kv-events"
	}
	kc, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
		"endpoint": fmt.Sprintf("tcp://*:%d", port), "topic": cfg.KVEventsTopic})
	cfg.Command += " --kv-events-config '" + string(kc) + "'"
	return fmt.Sprintf("tcp://127.0.0.1:%d", port), nil
}

// connectable turns a bind endpoint (tcp://*:5557) into one to dial.
func connectable(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://*:"); ok {
		return "tcp://127.0.0.1:" + rest
	}
	return ep
}

// startKVEvents starts the subscriber and the tokenize loop (Close stops them).
func (e *Engine) startKVEvents(endpoint string) {
	kv := &kvEvents{m: newKVMap(kvBlockBytes), queue: make(chan kvJob, kvQueueLen)}
	kv.sub = &kvSub{endpoint: endpoint, topic: e.cfg.KVEventsTopic, m: kv.m, log: e.core.Logger()}
	e.kv = kv
	e.loops.Add(2)
	go func() { defer e.loops.Done(); kv.sub.run(e.ctx) }()
	go func() { defer e.loops.Done(); e.tokenizeLoop() }()
}

// observe queues a request's prompt for mapping; it never blocks.
func (e *Engine) observe(req *engine.Request) {
	kv := e.kv
	if kv == nil || req.Kind != schemas.KindChat && req.Kind != schemas.KindCompletion || len(req.Body) < kvBlockBytes {
		return
	}
	j := kvJob{kind: req.Kind, model: req.Model, body: append([]byte(nil), req.Body...)}
	if e.adapters.has(req.Model) {
		j.lora = req.Model
	}
	select {
	case kv.queue <- j:
	default:
		kv.tokenizeDropped.Add(1)
	}
}

func (e *Engine) tokenizeLoop() {
	kv := e.kv
	for {
		select {
		case <-e.ctx.Done():
			return
		case j := <-kv.queue:
			e.mapPrompt(j)
		}
	}
}

// mapPrompt hashes a prompt's text, asks vLLM for its tokens and registers
// both; a prompt registered recently is skipped.
func (e *Engine) mapPrompt(j kvJob) {
	kv := e.kv
	span := schemas.PromptSpan(j.body)
	text := schemas.PromptBlockHashes(nil, j.model, span, kvBlockBytes)
	if len(text) == 0 {
		return
	}
	if kv.m.known(text[len(text)-1]) {
		kv.tokenizeKnown.Add(1)
		return
	}
	body, ok := tokenizeBody(j, span)
	if !ok {
		return
	}
	kv.tokenizeCalls.Add(1)
	ctx, cancel := context.WithTimeout(e.ctx, kvTokenizeTimeout)
	defer cancel()
	status, answer, err := e.core.Call(ctx, "POST", "/tokenize", body)
	var out struct {
		Tokens []int64 `json:"tokens"`
	}
	if err == nil && status == 200 {
		err = json.Unmarshal(answer, &out)
	} else if err == nil {
		err = fmt.Errorf("POST /tokenize answered %d", status)
	}
	if err != nil {
		kv.tokenizeErrors.Add(1)
		e.core.Logger().Debug("vLLM KV events: prompt not tokenized", "err", err)
		return
	}
	ids := make([]uint32, 0, len(out.Tokens))
	for _, t := range out.Tokens {
		if t < 0 || t > 1<<32-1 {
			kv.tokenizeErrors.Add(1)
			return
		}
		ids = append(ids, uint32(t))
	}
	kv.m.register(text, len(span), ids, j.lora)
}

// tokenizeFields are the chat request's fields that shape vLLM's templated
// prompt, passed on to /tokenize.
var tokenizeFields = []string{"add_generation_prompt", "continue_final_message", "add_special_tokens",
	"chat_template", "chat_template_kwargs", "tools"}

// tokenizeBody is the /tokenize request for a prompt: the chat's messages
// with the fields that shape its template, or a completion's prompt if it
// is one string (token ids need no tokenizing, and are not mapped: rare).
func tokenizeBody(j kvJob, span []byte) ([]byte, bool) {
	model, _ := json.Marshal(j.model)
	if j.kind == schemas.KindCompletion {
		if len(span) == 0 || span[0] != '"' {
			return nil, false
		}
		b := append([]byte(`{"model":`), model...)
		b = append(append(append(b, `,"prompt":`...), span...), '}')
		return b, true
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(j.body, &top) != nil || top["messages"] == nil {
		return nil, false
	}
	req := map[string]json.RawMessage{"model": model, "messages": top["messages"]}
	for _, f := range tokenizeFields {
		if v, ok := top[f]; ok {
			req[f] = v
		}
	}
	b, err := json.Marshal(req)
	return b, err == nil
}

// KVEventsOn reports whether the engine reads vLLM's KV events
// (Config.KVEvents; engine.KVEventer).
func (e *Engine) KVEventsOn() bool { return e.kv != nil }

// DrainKVEvents returns the prefix-cache events since the last call, named
// by text block hashes (engine.KVEventer); ok is false when there are none
// or KV events are off.
func (e *Engine) DrainKVEvents() (schemas.KVEvents, bool) {
	if e.kv == nil {
		return schemas.KVEvents{}, false
	}
	return e.kv.m.drain()
}

// KVEventStats counts the KV events read and how they were mapped
// (engine.KVEventStatser); zero when KV events are off.
func (e *Engine) KVEventStats() engine.KVEventStats {
	kv := e.kv
	if kv == nil {
		return engine.KVEventStats{}
	}
	ms := kv.m.statsNow()
	return engine.KVEventStats{
		Received: kv.sub.received.Load(), DecodeErrors: kv.sub.decodeErrors.Load(), Unknown: kv.sub.unknown.Load(),
		Connects: kv.sub.connects.Load(), Lost: ms.Lost, Skipped: ms.Skipped, Mapped: ms.Mapped, Unmapped: ms.Unmapped,
		TokenizeCalls: kv.tokenizeCalls.Load(), TokenizeErrors: kv.tokenizeErrors.Load(),
		TokenizeDropped: kv.tokenizeDropped.Load(), TokenizeKnown: kv.tokenizeKnown.Load(),
	}
}
