// Package gateway is tokenbus's HTTP front: an OpenAI-compatible API on Fiber
// that publishes each request on NATS (through package client) and turns the
// reply stream into Server-Sent Events or a single JSON response.
//
// # Routes
//
//	POST /v1/chat/completions                              kind chat
//	POST /v1/completions                                   kind completion
//	POST /v1/embeddings                                    kind embedding (one JSON answer, never a stream)
//	GET  /v1/models, /v1/models/{id}                       id may contain '/'
//	     /predictions/{model}/{version}/v1/...             the same four, TorchServe's form
//	POST /tokenize, /detokenize                            kinds tokenize, detokenize: vLLM's, at the root as vLLM serves them
//	GET  /version                                          {"version":"<tokenbus version>"}, as vLLM's
//	GET  /health                                           200 {"status":"ok"} while the process runs
//	GET  /ready                                            200 when NATS is connected and a healthy worker serves a model, else 503
//	GET  /metrics                                          Prometheus text
//	POST /v1/files, GET /v1/files[/{id}[/content]]         with Config.Batches: OpenAI's Files API (files.go)
//	DELETE /v1/files/{id}
//	POST /v1/batches, GET /v1/batches[/{id}]               OpenAI's Batches API (batches.go); runs in batch.Runner
//	POST /v1/batches/{id}/cancel
//
// Every error, including unknown routes (404), wrong methods (405), bodies over
// the limit (413) and a wrong Content-Type (415), is OpenAI's nested
// {"error":{"message","type","param","code"}} with its HTTP status and, for
// 429/503, Retry-After.
//
// # Decisions
//
// CORS (cors.go). Config.CORS, when it names an origin (or "*"), is one
// middleware on the whole app, so every route (those added later too)
// answers a preflight (OPTIONS with Origin and Access-Control-Request-Method)
// with 204 before routing and authentication (a preflight carries no
// credentials), and every other response to an allowed Origin (errors,
// fasthttp's own 413, SSE streams, whose head httpstream builds from the
// headers set before the handler ran) carries Access-Control-Allow-Origin and
// exposes X-Request-Id, Retry-After and the x-ratelimit-* headers. A
// disallowed origin gets no Access-Control-* header at all (the browser
// blocks it). With credentials the allowed Origin is echoed, never "*", with
// Vary: Origin.
//
// Model list (catalog.go). /v1/models is in vLLM's order: base models first,
// then each base model's adapters, so a tool that takes the first model gets
// a base model. A base model's max_model_len is the one the operator
// registered, else the smallest its workers' engines report in heartbeats;
// an adapter shows its base model's.
//
// Body pass-through. The gateway reads a body once, with schemas.ReadRequest,
// the reader every process of tokenbus uses (the dispatcher for NATS-native
// requests, the worker for its engine), decides on that view (model, stream,
// n, priority...) and publishes the client's body byte for byte, so unknown
// and engine-specific fields reach the engine untouched. Chunks from workers
// are written as "data: <line>\n\n" without being decoded. Keys match
// exactly and a body that repeats a field tokenbus reads is a 400:
// encoding/json alone folds case and keeps the last duplicate, where the
// Python engines behind the bus match exactly, so {"model":"a","Model":"b"}
// could be routed (and later authorised) as one model and run as another.
//
// Bodies are read raw: a Content-Encoding other than identity is a 415 (Fiber
// would inflate it with no bound). fasthttp streams request bodies; every
// body but an upload's is read whole before its handler (bufferBodies), and
// one over BodyLimit is refused before it is read; the gateway then drains
// it (bounded: 64 MiB, 2 s) before the connection closes, so the client
// reads a clean 413 instead of a reset. POST /v1/files is admitted on its
// headers (API key, upload limits per tenant and in all, FileLimit, the
// tenant's quota) and only then read, its file part streamed into the
// store (uploads.go): nothing on disk, a bounded few hundred KiB per upload.
//
// TorchServe form. In /predictions/{model}/{version}/v1/... the path names the
// model: a "model" in the body that names another is 400 model_mismatch (as a
// Tb-Model header that disagrees with a request subject is on the bus; a proxy
// in front may authorise by path). When the body has none, the gateway
// inserts "model":"<path model>" right after the body's opening brace (the one
// edit it ever makes to a body), so every engine downstream, including ones
// that forward the body to vLLM as is, sees a complete OpenAI request. The
// version segment is accepted and ignored. The models routes under this
// prefix list every servable model, like /v1/models.
//
// Errors before the first token keep their real status. A stream's response
// is committed only once the first chunk arrived; until then no worker, a full
// queue, an unknown model or an engine's 400 come back as that status, not as
// an in-band error after a 200. An error after the first byte is sent as
// data: {"error":{...}} and data: [DONE].
//
// Vanished clients. fasthttp has no per-request cancel signal and a write
// error only shows up when there is something to write, so while a request is
// silent (queued, long prefill, stream:false) a watcher (httpstream.Watcher)
// probes the client's socket every ProbeInterval: on Linux and macOS a
// non-blocking MSG_PEEK recv, which reads nothing and so can never eat a
// pipelined request; else a 1 ms read deadline and a one-byte Read. End of
// file or a socket error means the client hung up: the request's context is
// cancelled (cause errClientGone) and its Stream closed, which tells the
// worker (or every dispatcher's queue) to drop it. A client that stops
// reading while frames wait is cut the same way after StuckTimeout. A client
// that half-closes its sending side after the request looks gone too; HTTP
// clients do not do that. No SSE comments or keep-alive events are sent
// during silence: openai-go before v3.43 breaks on them.
//
// Streams and connections. The HTTP side of a stream is package httpstream:
// the stream is written straight to the connection (hijacked from fasthttp),
// each burst of chunks in one syscall and the first from the handler's
// goroutine: fasthttp's body-stream writer costs a pipe and a second goroutine
// per flush and writes at most 4 KiB per syscall (BenchmarkLoopbackStream
// compares the two). HTTP/1.1 streams use chunked encoding, and after a clean
// end the connection is handed back to fasthttp (Server.ServeConn) for the
// client's next request, so the connection pools of OpenAI clients work as
// against OpenAI; HTTP/1.0 and Connection: close requests get a stream that
// ends with the connection. The handler (completions.go) begins the stream
// with the headers it has set, writes the first chunk, and leaves the rest to
// writeStream, which runs after the handler returned and touches no fiber.Ctx.
// A foreground Responses stream (responses_stream.go) is written the same
// way, as named events and with no [DONE] (the Responses API's form).
//
// Shutdown. Shutdown closes the listener and the connections handed back
// after a stream that wait for a request (httpstream.Server.Drain), lets open
// requests finish until its context ends, then cuts the rest: every request's
// context derives from one gateway-wide context, so writers blocked on a
// silent worker end at once with a 503 shutting_down error event and [DONE],
// and their workers are told to cancel. A cut stream's writes get one more
// second, so a client that reads nothing cannot hold it.
//
// Hooks. Config.Authorize is called with the body's view after the body is
// parsed and before the request is published; it returns the request's
// Principal (tenant, API key id, tokens reserved against the key's limit) and
// may set response headers. Config.OnUsage is called with a
// schemas.UsageRecord of that Principal once for every request that finished
// with a done frame (stream or not), with the usage at the top level of the
// done payload (zero if it had none). Requests that failed or were cancelled
// do not call OnUsage. Config.ModelAccess authenticates the models routes and
// says which models the caller may see (others are 404). Package auth
// implements all three on API keys, rate limits and usage in Redis.
//
// The edge (docs/security.md, HTTP). Throttle (throttle.go) backs off failed
// credential checks per client address and key prefix, for auth and the
// admin API; ClientAddr believes X-Forwarded-For only from trusted proxies.
// Request-smuggling shapes are refused before the body is read
// (framing.go). No error body or log line carries a header value or the raw
// request; what they quote of a request passes a Redactor (redact.go).
//
// Catalog. /v1/models, the choice between 404 (unknown model) and 503 (known,
// no worker) and /ready come from a Catalog; NewCatalog joins the live workers
// (a fleet.View: the embedded dispatcher's fleet, or one fed by fleet.Watch)
// with the registry cache, which may be absent.
//
// Metrics are labelled by route pattern and by model only when the catalog
// knows the model (else "unknown"), and error codes by the catalogue (else
// "upstream"), so label cardinality stays bounded. Stream metrics (time to
// first token, inter-token latency, duration, chunks, a stream that fails
// after its first token: counted as 200 and in stream_errors_total) are
// recorded in the stream writer, after the handler has returned, with the
// label's series looked up once per stream, never per token.
//
// Tokenbus imports: batch, client, fleet, gateway/httpstream, internal/tracing, responses, schemas.
package gateway
