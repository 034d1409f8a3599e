// Package fakevllm is a stand-in for vLLM's OpenAI server, for the tests of
// anything that talks to one: the HTTP engines, the engine conformance suite
// (workers/engine/enginetest), the bench tool, a worker in the integration
// tests. It serves chat and completions (SSE or JSON) as vLLM writes them,
// /v1/models with LoRA adapters, /metrics, /health, the runtime LoRA
// endpoints, /v1/embeddings (for an embedding model, Server.Pooling; else
// vLLM's 400 for a generative model), /tokenize and /detokenize (a token per
// byte; Server.NoTokenize answers 404 as servers without them do), and the
// failures a client must survive. It is an http.Handler:
// serve it with httptest.NewServer.
//
// A body is read with schemas.ReadRequest, as every part of tokenbus reads
// it, so a bad field is vLLM's 400 naming it, and the answer follows the
// request: n choices of max_tokens content chunks each (3 when max_tokens is
// not set), a chat stream beginning with the role chunk, the last content
// chunk of a choice carrying finish_reason "length", and a usage chunk when
// stream_options asks (vLLM's rule: present means on unless include_usage is
// false). Content chunk i of a choice is the text " tok<i>"; usage says 7
// prompt tokens (2 cached) and one completion token per content chunk.
//
// Chunks have vLLM's members in vLLM's order, token ids included: with
// "return_token_ids": true a stream's first chunk names the prompt's ids
// (prompt_token_ids: at the top of a chat stream's role chunk, in a
// completions choice) and each content chunk its token's (token_ids);
// unasked they are null, as vLLM writes them. Token ids follow from the
// context (tokens.go): a text prompt is 7 ids, content token " tok<p>" is
// id FirstTokenID+p, and a token-id prompt ending in such an id goes on at
// the next position, with usage counting its ids: a stream continued from
// the ids of its prompt and of what it streamed is one uninterrupted run's,
// one continued from its text starts again at " tok0".
//
// A request scripts the rest with an "x_fake" object in its body (which also
// shows that unknown fields reach the server), as envoyproxy/ai-gateway's
// testupstreamlib is driven by its requests; a client that cannot add a field
// (the bench tool, a gateway in front of the engine) gets Server.Default:
//
//	{"x_fake": {"mode": "...", "chunks": 3, "status": 400, "delay_ms": 0, "ttft_ms": 0,
//	            "cut_after": 0, "stop_at": 0}}
//
// cut_after N ends the first stream of each request id on this server after
// N content chunks, without finish_reason (the engine cut it: a
// migration's continuation of the same id is not cut); stop_at P ends a
// choice with finish_reason "stop" at the token of position P, where a
// model's end-of-sequence token would.
//
// Modes: "" (normal), "error_flat" and "error_nested" (a non-2xx answer in
// vLLM's old and new shapes), "midstream_error" (chunks with no
// finish_reason, then a data line with an error object), "break" (the same
// chunks, then the connection is closed), "nodone" (the chunks of a normal
// answer, finish_reason included, then the body ends without [DONE]: a
// clean end), "truncate" (chunks with no finish_reason, then the body ends),
// "truncate_done" (the same, then [DONE]), "empty" (a 200 stream that ends
// with no chunk), "slow" (one chunk,
// the role chunk of a chat stream, or nothing for stream:false, then wait
// for the client to go: the request id is sent on Cancelled), "burst" (every
// event in one write).
//
// vLLM's KV-transfer handshake (prefill/decode disaggregation, disagg.go):
// a stream:false request whose kv_transfer_params have "do_remote_decode":
// true answers with vLLM's kv_transfer_params at the top level (the
// server's EngineID, block ids, its own host and port); a request whose
// params have "do_remote_prefill": true is recorded (TransferParams,
// LastTransferParams, RemotePrefills) and answered as usual, or with
// SetRefuseTransfer(true) refused with a 503 kv_transfer_failed. Nothing
// is held or pulled.
//
// Tokenbus imports: schemas.
package fakevllm
