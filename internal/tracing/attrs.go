package tracing

// Span attribute keys. Where OpenTelemetry's semantic conventions (HTTP,
// messaging, GenAI) have a name it is used; the rest are tokenbus.*.
const (
	AttrRequestID    = "tokenbus.request_id"
	AttrWorker       = "tokenbus.worker.id"
	AttrDispatcher   = "tokenbus.dispatcher.id"
	AttrQueued       = "tokenbus.queued"  // the request waited in a dispatcher's queue
	AttrAttempt      = "tokenbus.attempt" // workers the request bounced off so far
	AttrStream       = "tokenbus.stream"
	AttrOutcome      = "tokenbus.outcome"
	AttrBounceReason = "tokenbus.bounce.reason" // why a worker handed a request back: full or draining
	// AttrUsageEstimated is true when the token counts on a span are the
	// engine's estimate (an HTTP engine's stream without a usage object:
	// one token per chunk, prompt unknown), absent when they are counted.
	AttrUsageEstimated = "tokenbus.usage.estimated"
	// The cached prompt tokens a dispatcher predicted for a request routed
	// by prefix, and those its engine reported (a worker's span).
	AttrPrefixPredicted = "tokenbus.prefix_cache.predicted_tokens"
	AttrPrefixCached    = "tokenbus.prefix_cache.cached_tokens"
	AttrErrorStatus     = "tokenbus.error.status" // the HTTP status of a tokenbus error
	// Prefill/decode disaggregation: the prefill worker a dispatcher chose
	// (dispatch span) and that ran the prefill (decode worker's "prefill"
	// span), the remote engine whose KV blocks the decode took, and how the
	// remote prefill went (ok, or why the request ran whole).
	AttrPrefillWorker  = "tokenbus.prefill.worker.id"
	AttrPrefillEngine  = "tokenbus.prefill.remote_engine_id"
	AttrPrefillOutcome = "tokenbus.prefill.outcome"
	AttrModel          = "gen_ai.request.model"
	AttrOperation      = "gen_ai.operation.name" // chat or text_completion
	AttrInputTokens    = "gen_ai.usage.input_tokens"
	AttrOutputTokens   = "gen_ai.usage.output_tokens"
	AttrMsgSystem      = "messaging.system" // nats
	AttrMsgDest        = "messaging.destination.name"
	AttrMsgOperation   = "messaging.operation.type"
	AttrHTTPMethod     = "http.request.method"
	AttrHTTPRoute      = "http.route"
	AttrHTTPStatus     = "http.response.status_code"
	AttrServerAddr     = "server.address"
	AttrServerPort     = "server.port"
	AttrURLFull        = "url.full"
)

// EventFirstToken is the span event a worker adds when the first chunk goes
// out (time to first token); there is no event per token.
const EventFirstToken = "first_token"
