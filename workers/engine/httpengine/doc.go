// Package httpengine is the part the vllm and openai engines share: it drives
// an OpenAI-compatible HTTP server (vLLM, llama.cpp server, SGLang, TGI,
// another tokenbus) and passes its JSON through untouched.
//
// Requests: the client's body is POSTed byte for byte to /v1/chat/completions
// or /v1/completions (by Request.Kind) with traceparent and X-Request-Id (as
// Config.RequestID says: the id, a UUID made from it, or none; see
// requestid.go). A text/event-stream answer is read line by line; the JSON
// after each "data: " goes to the Sink as is, and every data line already in
// the read buffer goes in the same Chunks call ('\n'-separated), without ever
// waiting for more. A stream that had a finish_reason ends at "data: [DONE]"
// or at the end of the body (some servers send no [DONE]); the rest of the
// body is read in the background, so the connection is reused. One that ends
// either way before any finish_reason, or with no chunk at all, is a 502
// engine_stream_truncated: never a clean end. Any other 2xx answer is the
// non-stream response, returned whole as Result.Response.
//
// Usage: the last chunk with a "usage" object fills Result.Usage. A stream
// without one (the client did not ask for stream_options.include_usage, and
// the body is never changed to ask for it) gets a best-effort count: each
// data chunk without usage counts as one completion token, prompt tokens 0.
//
// Errors, all *schemas.Error: a non-2xx answer keeps its status and becomes
// OpenAI's nested error (from vLLM's flat or nested shape, TGI's, FastAPI's
// "detail" or plain text), except that FastAPI's validation list is a 400
// naming the field and a 500 that is not an error object a 502 with its
// text, and any status outside 4xx and 5xx a 502 (a redirect is not
// followed: the body is not sent twice); an empty one names the status and
// endpoint and is logged; a data line whose first key is "error" (vLLM,
// SGLang, OpenAI and TGI send the error object alone) ends the request with
// that error (status from its code, else 502); a connection that cannot be
// made or breaks before the answer is a 503 engine_unhealthy; one that breaks
// mid-stream, a stream silent for StallTimeout or a non-stream answer slower
// than ResponseTimeout is a 502 engine_error. A cancelled ctx cancels the
// upstream request, which closes its connection, so the server aborts the
// generation.
//
// Health is judged in the background (Health never does I/O), from the
// outcomes of generation requests first: an answer below 500 (a 4xx too) or
// bytes of a stream prove the server alive. GET HealthPath is probed only when no
// request is in flight (a probe must neither queue behind generation nor
// interrupt it on a server that runs one request at a time), and its
// failure does not count while requests are being answered. Requests in
// flight are never ended for a bad verdict: a dead server fails them by
// itself (connection refused or reset, StallTimeout).
//
// Connections: an engine on plain http with no proxy gets a keep-alive
// HTTP/1.1 client that works in the caller's goroutine (h1.go; net/http's
// Transport, which hands each request to two goroutines of its connection,
// took a tenth more CPU per request); https and proxied engines use
// net/http's Transport.
//
// With Command set, the server is a child process (see process.go).
//
// Tokenbus imports: internal/tracing, schemas, workers/engine.
package httpengine
