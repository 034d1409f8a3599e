// Package fakevllm is a scripted stand-in for vLLM's OpenAI server, for the
// HTTP engines' tests: chat and completions (SSE or JSON), /v1/models with
// LoRA adapters, /metrics, /health, the runtime LoRA endpoints, and the
// failures an engine must survive.
//
// A request scripts its own answer with an "x_fake" object in its body
// (which also shows that unknown fields reach the server):
//
//	{"x_fake": {"mode": "...", "chunks": 3, "status": 400, "delay_ms": 0}}
//
// Modes: "" (normal), "error_flat" and "error_nested" (a non-2xx answer in
// vLLM's old and new shapes), "midstream_error" (chunks, then a data line
// with an error object), "break" (chunks, then the connection is closed),
// "nodone" (chunks, then the body ends without [DONE]), "slow" (one chunk,
// or nothing for stream:false, then wait for the client to go: the request
// id is sent on Cancelled), "burst" (every event in one write).
//
// Tokenbus imports: none.
package fakevllm
