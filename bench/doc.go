// Package bench is `tokenbus bench`: a load generator for any OpenAI-compatible
// endpoint (/v1/chat/completions or /v1/completions), in the spirit of
// `vllm bench serve`; --endpoint embeddings loads /v1/embeddings instead
// (one input of --input-len per request, encoding_format base64 as the
// official SDKs send it, never streamed: an answer must be a list with one
// embedding and usage; TTFT is then the whole request, input tokens are
// usage.prompt_tokens and output tokens 0).
//
// It sends --num-prompts requests with at most --concurrency in flight and,
// with --request-rate, Poisson arrivals; it reads every SSE stream itself
// (net/http and a bufio.Reader, no SDK) so that the client stays cheap, and
// verifies each one against the OpenAI stream shape: HTTP 200,
// text/event-stream, only `data:` lines, one id across all chunks, valid
// choice indexes, one finish_reason per choice, no `error` key, a usage chunk
// (stream_options.include_usage is sent) and a final `data: [DONE]`. A request
// that breaks any rule counts as failed, by kind: http_<status>, stream_error,
// protocol_<what>, timeout, connection.
//
// Metrics follow vllm bench serve: request and output token throughput, TTFT
// (request sent to the first non-empty content chunk), ITL (gap between
// consecutive content chunks), TPOT ((e2e - ttft) / (tokens - 1)) and e2e
// latency, each as mean, p50, p90, p99 and max (linear interpolation between
// ranks, like numpy.percentile). Output tokens are usage.completion_tokens;
// without a usage chunk, the number of content chunks.
//
// Examples:
//
//	tokenbus bench --url http://gw:8080/v1 --model llama-8b --concurrency 64 --num-prompts 512 \
//	    --input-len 512 --output-len 128 --json out.json --plot out.png
//	tokenbus bench --url http://gw:8080/v1 --compare-url http://vllm:8000/v1 --request-rate 20 \
//	    --shared-prefix 256 --warmup 8
//
// --adapters N spreads the requests over N LoRA adapters named
// <model>-lora-1 … <model>-lora-N (registered beforehand), adapter k drawn
// with weight 1/k^S (--adapter-zipf S, > 1), for adapter placement
// (docs/routing.md).
//
// --sessions S --turns T (chat only) runs S multi-turn conversations instead
// of --num-prompts requests (which it ignores: the run is S×T requests): a
// system message of --shared-prefix words (one for all sessions, or with
// --prefix-groups G, G of them) and T user turns of --input-len words. Turn k
// sends the whole history — system, user 1, assistant 1, …, user k — where
// assistant i is the text the endpoint streamed on turn i, so each endpoint
// of a --compare-url run builds on its own answers. A session's turns are
// sequential; at most --concurrency sessions run at once, started in an order
// shuffled by --seed (and paced by --request-rate); a failed turn ends its
// session. The report adds TTFT and prefix-cache hits by turn and for turns
// ≥ 2, where the history can be reused (sessions.go).
//
// Every flag also reads TOKENBUS_<FLAG> (flag > environment > default).
//
// # Comparing two endpoints
//
// --url is the TARGET, the system under test (e.g. the tokenbus gateway).
// --compare-url is the BASELINE it is measured against (e.g. vLLM directly).
// Both get the same prompts and the same arrival schedule, interleaved in
// --rounds rounds so that both see the same machine conditions: the prompts
// are split into rounds and round r runs target then baseline when r is even,
// baseline then target when r is odd. The report puts target and baseline
// side by side with target/baseline ratios for everything and target −
// baseline for latencies; "added TTFT" is target − baseline.
//
// Every run drains at the end of each round, so a compare run's throughput is
// a little lower than one long run of the same load; both sides pay equally.
//
// # Bounds
//
// Each request has --timeout; --duration caps the run (in compare mode each of
// the 2×rounds phases gets an equal share, so both sides get equal time);
// cancelling ctx (Ctrl-C in the main binary) aborts requests in flight and
// prints the partial report. Memory is about 4 bytes per streamed chunk.
//
// Tokenbus imports: internal/flagenv, schemas.
package bench
