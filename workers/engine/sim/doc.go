// Package sim is tokenbus's built-in simulated inference engine. It behaves
// like vLLM as seen from its OpenAI API (same request fields, same JSON,
// same errors) and like a GPU from the outside (time to first token, time
// per output token, batching, KV-cache pressure), without a GPU or a model.
//
// It is a scheduler model, not a sleep per token. One goroutine runs steps,
// like vLLM's engine loop. Sequences wait in a FIFO queue and are admitted
// into the running batch while there are fewer than MaxNumSeqs running, while
// the step's prefill token budget lasts and while the KV cache has blocks for
// them. The KV cache is paged (BlockSize tokens per block, NumBlocks blocks)
// with prefix caching: full blocks of prompt tokens are found again by a
// chained hash, also after their sequence finished (they wait in an LRU of
// free cached blocks), so a repeated prompt prefix prefills faster and is
// reported as usage.prompt_tokens_details.cached_tokens; what it stores and
// evicts is reported (DrainKVEvents) with blocks named as tokenbus's
// dispatchers name prompt text, for prefix-aware routing (kvevents.go). A running sequence
// that needs a block when none is free preempts the most recently admitted
// one, which goes back to the head of the queue and is recomputed later.
//
// Every step produces one token for every running sequence and costs, in
// simulated time (one sleep per step, for the whole batch):
//
//	base + PrefillPerToken × (tokens prefilled in the step, cache hits excluded)
//	     + DecodePerSeq × (sequences decoding in the step)
//
// where base is PrefillBase if the step prefills anything, else DecodeBase
// (a sequence admitted with its prompt's KV taken from a remote prefill
// prefills nothing).
// With all four durations zero the engine runs as fast as the CPU allows.
//
// Output text is drawn from a list of common English words, each one
// cl100k_base token, from a seed (the request's seed, else a hash of the
// prompt), so it is deterministic and its token count is exact. A LoRA
// adapter mixes a hash of its path (its weights) into the seed: it answers
// differently from its base model, the same for the same prompt. Prompts are
// counted with cl100k_base; chat messages get a ChatML template
// (<|im_start|>role\ncontent<|im_end|>\n each, and <|im_start|>assistant\n).
// Without ignore_eos a sequence ends by itself ("stop") at a length drawn
// from the seed between MinEOS and MaxEOS tokens, with a full stop.
//
// Request fields honoured: model, messages (string content or text parts),
// prompt (string, strings, token ids, arrays of token ids), max_tokens
// (completions default 16), max_completion_tokens, n, stop,
// include_stop_str_in_output, stream, stream_options (as in vLLM, present
// means include_usage unless it is false), seed, ignore_eos, min_tokens,
// continue_final_message (chat: the last message is left open, with no
// generation prompt after it), response_format (format.go, jsonschema.go),
// tools, tool_choice and parallel_tool_calls (tools.go), logprobs and
// top_logprobs (logprobs.go), reasoning_effort (reasoning.go). An answer
// that is structured (JSON, tool calls) is made whole when the request
// arrives and delivered a token a step like text (answer.go). Others
// (temperature, echo...) are accepted and ignored.
//
// A continuation (engine.Request.Resume = N, from the Tb-Resume header of a
// migrated stream) goes on exactly where the failed worker stopped: the
// first N tokens of the sequence are drawn and dropped, with the seed of the
// original prompt (the continuation's prompt less its last N tokens) unless
// the request has one; usage and max_tokens count only the new tokens. With
// reasoning on, N counts the answer's tokens: the reasoning is dropped too.
//
// Sleep mode imitates vLLM's level 1 (engine.Sleeper, sleep.go): Sleep
// takes SleepTime and empties the prefix cache, WakeUp takes WakeTime, and
// in between whatever needs the model is refused with a 503.
//
// A streaming request gets one Sink.Chunks call per step with a chunk for
// each of its sequences that produced text, made by the scheduler goroutine;
// a Sink error or a done context aborts the request within one step.
//
// Prefill/decode disaggregation (engine.KVTransferer, disagg.go,
// kvserver.go): the sim speaks vLLM's KV-transfer handshake, the
// NixlConnector's. A stream:false request whose kv_transfer_params say
// do_remote_decode is a prefill: its first sequence's KV blocks are held
// (counted in the KV cache, never evicted) for KVHoldTime or until a decode
// engine takes them, and its answer carries the kv_transfer_params a decode
// needs: this engine's id (new at every start), the block ids, the hold's
// id, and the host and port of the KV-transfer endpoint the engine serves
// (KVTransferAddr, an HTTP listener opened at the first prefill). A request
// with those params (do_remote_prefill) is a decode: it asks that endpoint
// for the blocks (the prefill engine frees them, or refuses: not held,
// another engine id, another prompt; or it is gone), fails with
// kv_transfer_failed before any chunk when it cannot have them, else waits
// KVTransferBase + KVTransferPerToken × prompt tokens outside the step loop
// and joins the batch with its prompt computed: its first step is a decode
// step. KVTransferStats counts both sides.
//
// With Config.Models it can serve several models, one loaded at a time as
// on a GPU: Switch loads another in SwitchTime (engine.Switcher, switch.go);
// each model answers differently and caches apart.
//
// Tokenbus imports: schemas, workers/engine.
package sim
