// Package simserver serves the sim engine (package sim) behind vLLM's own
// OpenAI-compatible HTTP API, so that tests and benchmarks can drive
// tokenbus's vllm engine, or any vLLM client, over real HTTP without a GPU,
// and compare "client → engine" with "client → tokenbus → engine".
//
// Routes, as vLLM (about 0.10 to 0.11) answers them:
//
//	POST /v1/completions, /v1/chat/completions   JSON or SSE (data: lines, then data: [DONE])
//	GET  /v1/models                              base model names and loaded LoRA adapters
//	POST /v1/load_lora_adapter, /v1/unload_lora_adapter   only with Config.AllowRuntimeLoRA
//	GET  /metrics                                Prometheus text, vLLM's metric names
//	GET  /health                                 200 empty; 503 after Close or when the engine is shut
//	GET  /version                                {"version": ...}
//	POST /tokenize, /detokenize                  the sim's own tokenizer (cl100k_base, ChatML)
//	POST /v1/embeddings                          the sim's embeddings (sim.EmbedText), OpenAI's shape
//	POST /sleep?level=N, /wake_up; GET /is_sleeping   sleep mode, only with Config.DevMode (sleep.go)
//
// Anything else is FastAPI's 404 {"detail":"Not Found"} (or 405). With API
// keys set, paths under /v1 need "Authorization: Bearer <key>" (else 401
// {"error":"Unauthorized"}, vLLM's body). A POST body must be
// application/json, else 415. Errors are vLLM's (≥ 0.10.1) nested shape with
// an int code, {"error":{"message","type","param","code":400}}, or with
// Config.LegacyErrors the flat shape of earlier versions,
// {"object":"error","message","type","param","code":400}.
//
// Streaming: the response headers go out as soon as the sim has accepted the
// request (sim.Accepter), like vLLM, so a request that queues does not look
// stalled. The sim calls Sink.Chunks from its scheduler goroutine; the sink
// only appends "data: <json>\n\n" per chunk to a buffer and wakes the
// handler's goroutine, which writes and flushes whatever is there (one write
// and one Flush per wake-up, so a client that reads slowly gets chunks
// coalesced, as vLLM's output collector does, and never blocks the
// scheduler). A client that goes away cancels the request's context, which
// aborts the sim request within one step.
//
// Prefill/decode disaggregation: the sim's KV-transfer handshake (vLLM's
// NixlConnector's, package sim) goes through as is: a prefill's JSON answer
// carries "kv_transfer_params", a decode takes them and streams, and a
// decode refused its blocks is a 503 (schemas.ErrKVTransferFailed) in
// vLLM's error shape before any event. The blocks travel between the
// engines' own KV-transfer endpoints, not this server.
//
// KV cache events: with a KVPublisher (sim-server --kv-events-config, vLLM's
// JSON) the sim's prefix cache stores and evictions go out as vLLM
// publishes them, over ZMQ PUB in msgspec's msgpack (kvevents.go).
//
// Deviations from vLLM are listed in the README of this directory.
//
// Tokenbus imports: schemas, workers/engine, workers/engine/sim.
package simserver
