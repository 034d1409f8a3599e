// Package vllm is the engine for a vLLM OpenAI server, attached by URL or
// started as a child process ("vllm serve ...", with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment). Requests and
// answers pass through untouched (see httpengine), but for what exact
// migration needs (request.go): return_token_ids on a stream whose client
// strips ids, and max_tokens on a continuation from token ids that has
// none.
//
// On top of httpengine it adds what vLLM offers:
//
//   - load from /metrics, scraped every MetricsInterval (metrics.go);
//   - served models from /v1/models, base models and LoRA adapters (entries
//     with a parent);
//   - the runtime LoRA API as engine.Adapters (lora.go): one upstream load or
//     unload per call, with vLLM's quirks handled. Which adapters to load,
//     coalescing, eviction and slots are the worker's adapter manager's
//     (workers/lora), as for every engine;
//   - sleep mode as engine.Sleeper (sleep.go): POST /sleep, POST /wake_up,
//     GET /is_sleeping, for a worker that puts an idle vLLM to sleep;
//   - with Config.KVEvents, what vLLM's prefix cache stored and evicted, as
//     engine.KVEventer: its KV cache events read from its ZMQ publisher
//     (kvsub.go, decoded by kvwire.go through tinylib/msgp) and mapped from token blocks to the
//     text block hashes dispatchers route by, through the prompts' token ids
//     from /tokenize (kvmap.go, kvevents.go; docs/routing.md).
//
// Tokenbus imports: internal/freeport, schemas, workers/engine, workers/engine/httpengine.
package vllm
