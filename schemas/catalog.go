package schemas

import (
	"fmt"
	"net/http"
)

// The error catalogue: every error tokenbus answers with, in one place, with
// its code (OpenAI's "code"), HTTP status, OpenAI type, retry hint and
// message. Code elsewhere makes errors only from these definitions (New,
// At), so a code, its status and its wording cannot drift apart between the
// processes that send it; the constructors that take a status or a message
// of their own do not exist outside this package, save FromUpstream for
// errors an engine answered. docs/errors.md is generated from this list (go
// test ./schemas -run TestErrorDocs -update) and a test fails when it is out
// of date.
//
// Codes follow OpenAI's where OpenAI has one for the case (invalid_type,
// missing_required_parameter, integer_below_min_value, model_not_found,
// invalid_api_key, rate_limit_exceeded...); a null code is what OpenAI sends
// for a malformed body. Several definitions may share a code when clients
// should treat the cases alike (every queue_full is "retry shortly").

// ErrorDef is one entry of the catalogue.
type ErrorDef struct {
	Code       string // "" is JSON null
	Status     int
	Type       string
	RetryAfter int    // seconds, sent as Retry-After; 0: none
	Param      string // the param it always names; "" when it names none or the caller does (At)
	Message    string // fmt format of the message; its arguments are New's or At's
	When       string // for docs/errors.md: when tokenbus sends it and what a client can do
	Section    string // for docs/errors.md: the group it is listed in
}

// New makes the error, its message formatted with args.
func (d *ErrorDef) New(args ...any) *Error {
	return d.At(d.Param, args...)
}

// At makes the error about param. String and error arguments are quoted
// at most MaxQuoted bytes long (Clip): they are often a client's.
func (d *ErrorDef) At(param string, args ...any) *Error {
	msg := d.Message
	if len(args) > 0 {
		quoted := make([]any, len(args)) // not in place: args may be the caller's slice
		for i, a := range args {
			switch v := a.(type) {
			case string:
				quoted[i] = Clip(v, MaxQuoted)
			case error:
				quoted[i] = Clip(v.Error(), MaxQuoted)
			default:
				quoted[i] = a
			}
		}
		msg = fmt.Sprintf(d.Message, quoted...)
	}
	e := newError(d.Status, d.Type, d.Code, Clip(param, MaxQuoted), msg)
	e.RetryAfter = d.RetryAfter
	return e
}

// Is reports whether e was made from d (same code and status).
func (d *ErrorDef) Is(e *Error) bool {
	if e == nil || e.Status != d.Status {
		return false
	}
	if e.Body.Code == nil {
		return d.Code == ""
	}
	return *e.Body.Code == d.Code
}

// Catalogue lists every definition.
var Catalogue []*ErrorDef

// Sections are the groups of docs/errors.md, in order.
var Sections = []string{secRequest, secHTTP, secBus, secEngine, secControl, secBatch, secResponses}

const (
	secRequest = "Request bodies"
	secHTTP    = "The HTTP API"
	secBus     = "The bus: dispatchers, workers, reply streams"
	secEngine  = "Engines and LoRA adapters"
	secControl = "API keys, limits and the admin API"
	secBatch   = "Files and batches"

	secResponses = "Responses"
)

func def(section string, d ErrorDef) *ErrorDef {
	d.Section = section
	p := &d
	Catalogue = append(Catalogue, p)
	return p
}

// Shorthands for the definitions below.
const (
	s400 = http.StatusBadRequest
	s503 = http.StatusServiceUnavailable
)

// --- Reading a request body (ReadRequest, and the admin API's bodies) ---

var (
	ErrBodyEmpty = def(secRequest, ErrorDef{Status: s400, Type: TypeInvalidRequest,
		Message: "The request body is empty; expected a JSON object.",
		When:    "The body is empty."})
	ErrBodyNotObject = def(secRequest, ErrorDef{Status: s400, Type: TypeInvalidRequest,
		Message: "The request body must be a JSON object.",
		When:    "The body is JSON but not an object."})
	ErrBodyNotJSON = def(secRequest, ErrorDef{Status: s400, Type: TypeInvalidRequest,
		Message: "We could not parse the JSON body of your request (%s). The API expects a JSON payload.",
		When:    "The body is not JSON; the message says where it breaks."})
	ErrBodyTrailing = def(secRequest, ErrorDef{Status: s400, Type: TypeInvalidRequest,
		Message: "The request body has data after its JSON object.",
		When:    "Admin API: more than one JSON value."})
	ErrInvalidType = def(secRequest, ErrorDef{Code: "invalid_type", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid type for '%s': expected %s, but got %s instead.",
		When:    "A field tokenbus reads has the wrong JSON type; param names it (messages[0].content, stream_options.include_usage...)."})
	ErrMissingParam = def(secRequest, ErrorDef{Code: "missing_required_parameter", Status: s400, Type: TypeInvalidRequest,
		Message: "Missing required parameter: '%s'.",
		When:    "messages (chat), prompt (completions), input (embeddings), tokens (detokenize), prompt or messages (tokenize) or a message's role is missing or null."})
	ErrNoModel = def(secRequest, ErrorDef{Code: "missing_required_parameter", Status: s400, Type: TypeInvalidRequest, Param: "model",
		Message: "You must provide a model parameter.",
		When:    "The body names no model (and the route gives none), or an empty one."})
	ErrEmptyArray = def(secRequest, ErrorDef{Code: "empty_array", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid '%s': empty array. Expected an array with minimum length 1, but got an empty array instead.",
		When:    "messages, prompt or input is [], or one of input's lists of token ids is."})
	ErrBelowMin = def(secRequest, ErrorDef{Code: "integer_below_min_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid '%s': integer below minimum value. Expected a value >= %d, but got %d instead.",
		When:    "n, max_tokens, max_completion_tokens or dimensions below 1, min_tokens below 0."})
	ErrAboveMax = def(secRequest, ErrorDef{Code: "integer_above_max_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid '%s': integer above maximum value. Expected a value <= %d, but got %d instead.",
		When:    "A value over an engine's limit (the sim's largest n, dimensions over the sim's embedding size)."})
	ErrIntRange = def(secRequest, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid '%s': integer out of range.",
		When:    "An integer field does not fit in 64 bits."})
	ErrDuplicateKey = def(secRequest, ErrorDef{Code: "duplicate_parameter", Status: s400, Type: TypeInvalidRequest,
		Message: "Duplicate key '%s' in %s.",
		When: "A field tokenbus reads appears twice (\"max_tokens\":5,\"max_tokens\":300): parsers disagree on which one counts, " +
			"so tokenbus takes neither. Keys match exactly, as in OpenAI's and vLLM's parsers: \"Max_Tokens\" is another, unknown key."})
	ErrInvalidValue = def(secRequest, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid '%s': %s.",
		When: "A value no engine accepts: an empty stop string or role, min_tokens over max_tokens, an empty prompt or embeddings input, " +
			"a token id outside the vocabulary, an encoding_format other than float and base64, tokenize or embeddings with both their input and messages. " +
			"The sim also: an unknown response_format type, tool type, tool_choice or reasoning_effort, a tool_choice naming no tool of the request " +
			"or without tools, a JSON Schema it cannot use (a $ref that does not resolve, an unknown type; the message says where), " +
			"top_logprobs without logprobs."})
	ErrStreamOptions = def(secRequest, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest, Param: "stream_options",
		Message: "Stream options can only be defined when `stream=True`.",
		When:    "stream_options without stream: true (vLLM's rule)."})
	ErrUnknownParam = def(secRequest, ErrorDef{Code: "unknown_parameter", Status: s400, Type: TypeInvalidRequest,
		Message: "Unrecognized request argument supplied: %s",
		When:    "Admin API: a field it does not know (completion requests pass unknown fields to the engine)."})
	ErrContextLength = def(secRequest, ErrorDef{Code: "context_length_exceeded", Status: s400, Type: TypeInvalidRequest,
		Message: "This model's maximum context length is %d tokens. However, you requested %s. Please reduce the length of the %s.",
		When:    "Prompt plus max_tokens over the model's context length (the sim; vLLM answers this itself)."})
	ErrUnknownKind = def(secRequest, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Unknown request kind %q.",
		When:    "A request of a kind tokenbus does not know (Tb-Kind: chat, completion, embedding, tokenize, detokenize) reached a reader."})
)

// --- The HTTP API (gateway, admin API) ---
var (
	ErrUnsupportedMediaType = def(secHTTP, ErrorDef{Code: "unsupported_media_type", Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest,
		Message: "Unsupported Content-Type: expected application/json.",
		When:    "A completion request that is not Content-Type: application/json."})
	ErrContentEncoding = def(secHTTP, ErrorDef{Code: "unsupported_media_type", Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest,
		Message: "Compressed request bodies are not supported: send the JSON body without Content-Encoding.",
		When:    "A Content-Encoding other than identity (an inflated body would have no bound)."})
	ErrUnknownURL = def(secHTTP, ErrorDef{Code: "unknown_url", Status: http.StatusNotFound, Type: TypeInvalidRequest,
		Message: "Unknown request URL: %s %s. Please check the URL for typos.",
		When:    "No such route."})
	ErrMethodNotAllowed = def(secHTTP, ErrorDef{Code: "method_not_allowed", Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest,
		Message: "Method %s is not allowed for %s.",
		When:    "The route exists for other methods."})
	ErrTooLarge = def(secHTTP, ErrorDef{Code: "request_too_large", Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest,
		Message: "The request body is larger than the limit of %d bytes.",
		When:    "The body is over --body-limit (or the NATS server's max_payload)."})
	ErrReadTimeout = def(secHTTP, ErrorDef{Code: "timeout", Status: http.StatusRequestTimeout, Type: TypeTimeout,
		Message: "The request was not received in time.",
		When:    "The client did not send its headers and body within the read timeout."})
	ErrBadHTTP = def(secHTTP, ErrorDef{Code: "bad_request", Status: s400, Type: TypeInvalidRequest,
		Message: "The HTTP request is malformed: %s.",
		When:    "The HTTP server could not read the request (a bad header, a bad chunked body)."})
	ErrHeadersTooLarge = def(secHTTP, ErrorDef{Code: "request_header_too_large", Status: http.StatusRequestHeaderFieldsTooLarge, Type: TypeInvalidRequest,
		Message: "The request's headers are too large.",
		When:    "The headers are over the HTTP server's limit."})
	ErrModelNotFound = def(secHTTP, ErrorDef{Code: "model_not_found", Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "model",
		Message: "The model `%s` does not exist.",
		When:    "The model is neither registered nor served by a live worker."})
	ErrClientGone = def(secHTTP, ErrorDef{Code: "client_closed_request", Status: 499, Type: TypeInvalidRequest,
		Message: "The client closed the connection.",
		When:    "Never sent: the status of a request whose client went away, in logs, metrics and traces (nginx's 499)."})
	ErrRequestTimeout = def(secHTTP, ErrorDef{Code: "timeout", Status: http.StatusGatewayTimeout, Type: TypeTimeout,
		Message: "The request did not finish within %s.",
		When:    "The gateway's --request-timeout passed."})
	ErrNotConnected = def(secHTTP, ErrorDef{Code: "bus_unavailable", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Not connected to NATS.",
		When:    "GET /ready while the gateway has no NATS connection."})
	ErrNoWorkerUp = def(secHTTP, ErrorDef{Code: "no_worker", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "No worker is up.",
		When:    "GET /ready while no worker heartbeats."})
	ErrNoWorkerServing = def(secHTTP, ErrorDef{Code: "no_healthy_worker", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "No healthy worker serves a model (%d up).",
		When:    "GET /ready while every live worker is unhealthy (its engine), draining or serving no model."})
)

// --- The bus: dispatchers, workers, reply streams ---
var (
	ErrQueueFull = def(secBus, ErrorDef{Code: "queue_full", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "All workers for model `%s` are busy and its queue is full; retry shortly.",
		When:    "Every worker of the model is at its cap and the dispatcher's queue for it is full (--queue-size)."})
	ErrQueueTimeout = def(secBus, ErrorDef{Code: "queue_full", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "No worker became free in time for %s.",
		When:    "The request waited in a queue for --queue-timeout (or its deadline) without a worker taking it."})
	ErrQueueWaitTooLong = def(secBus, ErrorDef{Code: "queue_wait_too_long", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Model `%s` is saturated: this request would wait about %s in the queue, past its limit of %s; retry after Retry-After.",
		When:    "Flow control (docs/scheduling.md) estimated, from the measured service rate and the requests ahead in the request's band and tenant share, that it could not start before its deadline or its API key's max_queue_ms: it is refused at once instead of waiting in vain. Retry-After is the estimated wait."})
	ErrNoWorker = def(secBus, ErrorDef{Code: "no_worker", Status: s503, Type: TypeOverloaded, RetryAfter: 2,
		Message: "No worker is serving model `%s` right now.",
		When:    "The model is registered but no live worker serves it. Retry after Retry-After."})
	ErrColdStartTimeout = def(secBus, ErrorDef{Code: "cold_start_timeout", Status: s503, Type: TypeOverloaded, RetryAfter: 5,
		Message: "No worker for model `%s` came up within %s; retry after Retry-After.",
		When:    "The model is registered (or a worker can switch to it) but no live worker served it: the request waited for one to start, wake or switch (docs/capacity.md) for the dispatcher's --cold-start-timeout (or its deadline, or its API key's max_queue_ms) and none did."})
	ErrDispatcherGone = def(secBus, ErrorDef{Code: "no_dispatcher", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The dispatcher holding the request in its queue went silent for %s.",
		When:    "A queued request's dispatcher stopped sending its queued frame again every beat (it died, or lost NATS): the client sends the request again, at most its migration limit times, and answers this when it cannot."})
	ErrNoWorkerForBase = def(secBus, ErrorDef{Code: "no_worker", Status: s503, Type: TypeOverloaded, RetryAfter: 2,
		Message: "No worker is serving model `%s`, the base model of adapter `%s`, right now.",
		When:    "A registered LoRA adapter whose base model no live worker serves."})
	ErrForward = def(secBus, ErrorDef{Code: "no_worker", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Cannot forward the request to a worker: %v.",
		When:    "The dispatcher could not publish to the chosen worker (NATS connection down)."})
	ErrNoDispatcher = def(secBus, ErrorDef{Code: "no_dispatcher", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "No dispatcher is serving requests.",
		When:    "Nobody subscribes to the request subject (NATS answered \"no responders\")."})
	ErrDispatcherSilent = def(secBus, ErrorDef{Code: "no_dispatcher", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "No dispatcher answered within %s.",
		When:    "No frame came back for the client's first-frame timeout."})
	ErrReplyNotSent = def(secBus, ErrorDef{Code: "stream_lost", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The worker could not send a reply frame (%s): %v.",
		When:    "NATS refused a frame of the reply (connection down or closed): the worker ends the request and says so if it still can."})
	ErrBusUnavailable = def(secBus, ErrorDef{Code: "bus_unavailable", Status: s503, Type: TypeOverloaded, RetryAfter: 2,
		Message: "The message bus (NATS) is unreachable; retry shortly.",
		When:    "The client's NATS connection is down (reconnecting): the request is refused at once instead of waiting for a dispatcher."})
	ErrPublish = def(secBus, ErrorDef{Code: "no_dispatcher", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Cannot publish the request: %v.",
		When:    "The client could not publish the request (NATS connection down)."})
	ErrStreamGap = def(secBus, ErrorDef{Code: "stream_lost", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The reply stream lost messages (expected frame %d, got %d).",
		When:    "A gap in the reply stream's numbering: NATS dropped a message. The stream ends with an error, never with text missing."})
	ErrStreamOverflow = def(secBus, ErrorDef{Code: "stream_lost", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The reader is too slow: the reply stream overflowed.",
		When:    "The client's buffer for one stream (MaxPending frames) filled up."})
	ErrWorkerSilent = def(secBus, ErrorDef{Code: "stream_lost", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Worker %s went silent for %s.",
		When:    "The worker sent nothing, not even a keepalive, for the stall timeout: it is presumed dead."})
	ErrWorkerLost = def(secBus, ErrorDef{Code: "stream_lost", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Worker %s is gone (%s).",
		When:    "The worker serving the stream is known to be dead (its heartbeats stopped, or NATS saw it disconnect), before the stream ended."})
	ErrWorkerBusy = def(secBus, ErrorDef{Code: "worker_busy", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Worker %s is at capacity.",
		When:    "A request sent straight to a full worker, with no dispatcher to hand it back to."})
	ErrShuttingDown = def(secBus, ErrorDef{Code: "shutting_down", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The %s is shutting down.",
		When:    "The gateway, dispatcher, worker, engine or client is draining. Retry: another replica takes it."})
	ErrBadHeader = def(secBus, ErrorDef{Code: "invalid_header", Status: s400, Type: TypeInvalidRequest,
		Message: "Missing or invalid %s header.",
		When:    "A NATS-native request without a valid Tb-Request-Id, Tb-Kind or model."})
	ErrModelMismatch = def(secBus, ErrorDef{Code: "model_mismatch", Status: s400, Type: TypeInvalidRequest, Param: "model",
		Message: "The request is for the model `%s` but %s names `%s`.",
		When: "The subject (or the TorchServe path) is the authority on the model: a Tb-Model header or a body " +
			"\"model\" that names another model is refused, by dispatchers, workers and engines alike."})
	ErrDuplicateRequest = def(secBus, ErrorDef{Code: "duplicate_request", Status: s400, Type: TypeInvalidRequest,
		Message: "Request id %q is already running on this worker.",
		When:    "The same request (id and cancel token) reached one worker twice. A retry or migration, which sends the id again with a new token, is not a duplicate."})
	ErrDeadlinePassed = def(secBus, ErrorDef{Code: "timeout", Status: http.StatusGatewayTimeout, Type: TypeTimeout,
		Message: "The request's deadline passed %s.",
		When:    "Tb-Deadline passed before a dispatcher routed the request or a worker took it."})
	ErrTimedOut = def(secBus, ErrorDef{Code: "timeout", Status: http.StatusGatewayTimeout, Type: TypeTimeout,
		Message: "The request timed out.",
		When:    "A deadline passed while the request waited (the last resort of AsError)."})
	ErrBadErrorFrame = def(secBus, ErrorDef{Code: "engine_error", Status: http.StatusBadGateway, Type: TypeServer,
		Message: "Malformed error from a worker.",
		When:    "An error frame that is not an error object with a 4xx or 5xx status."})
	ErrUnknownControl = def(secBus, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Unknown control operation %q.",
		When:    "A request on a worker's control subject for an operation it does not have."})
	// Models switched on a shared pool (docs/capacity.md).
	ErrWorkerSwitching = def(secBus, ErrorDef{Code: "shutting_down", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Worker %s is switching to model `%s`.",
		When: "A request sent straight to a worker switching models (one from a dispatcher goes back to its queue), or " +
			"one still running there when the switch's drain timeout passed: retry, another worker takes it (the Go client migrates the stream)."})
	ErrSwitchUnknownModel = def(secBus, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest, Param: "model",
		Message: "Worker %s cannot switch to model `%s`: it can serve %s.",
		When:    "A switch (control operation) to a model the worker's can_serve does not list."})
	ErrSwitchHold = def(secBus, ErrorDef{Code: "switch_hold", Status: http.StatusConflict, Type: TypeInvalidRequest,
		Message: "Worker %s loaded `%s` %s ago and holds a model %s before it switches away; Retry-After says when.",
		When:    "A switch away from a model loaded less than the worker's --switch-hold ago: the hysteresis that keeps two busy models from making the pool thrash."})
	ErrSwitchBusy = def(secBus, ErrorDef{Code: "switch_in_progress", Status: http.StatusConflict, Type: TypeInvalidRequest,
		Message: "Worker %s is switching to model `%s` already.",
		When:    "A switch to another model while the worker switches (a switch to the same model is accepted: nothing to do)."})
)

// --- Engines and LoRA adapters ---
var (
	ErrEngine = def(secEngine, ErrorDef{Code: "engine_error", Status: http.StatusBadGateway, Type: TypeServer,
		Message: "The engine failed: %s.",
		When:    "The engine broke a stream, stalled, or sent what tokenbus cannot pass on (a line or a response over its limits)."})
	ErrEngineTruncated = def(secEngine, ErrorDef{Code: "engine_stream_truncated", Status: http.StatusBadGateway, Type: TypeServer,
		Message: "The engine's stream ended before it finished: %s.",
		When:    "A stream ended (with or without `[DONE]`) before any `finish_reason`, or a 200 stream had no chunk at all: never a clean end; another worker may finish it (the client retries or migrates)."})
	ErrEngineTimeout = def(secEngine, ErrorDef{Code: "timeout", Status: http.StatusGatewayTimeout, Type: TypeTimeout,
		Message: "The engine did not answer %s in time.",
		When:    "A control call to the engine (a LoRA load or unload, a sleep or wake-up) outlasted its timeout."})
	ErrEngineUnhealthy = def(secEngine, ErrorDef{Code: "engine_unhealthy", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The %s engine at %s is unavailable: %s.",
		When:    "The engine cannot be reached or fails its health check."})
	ErrWakeFailed = def(secEngine, ErrorDef{Code: "engine_unhealthy", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The %s engine of worker %s could not be woken from sleep: %s.",
		When: "The worker had put its idle engine to sleep (--sleep-after) and the wake-up this request waited for failed or " +
			"timed out. The worker reports itself unhealthy until a wake-up succeeds; retry, another worker takes it."})
	ErrEngineAsleep = def(secEngine, ErrorDef{Code: "engine_unhealthy", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The %s engine is asleep (sleep mode): wake it up first.",
		When: "A request reached a sim engine (or `tokenbus sim-server`) in sleep mode. A worker never sends one: it wakes " +
			"its engine first."})
	ErrKVTransferFailed = def(secEngine, ErrorDef{Code: "kv_transfer_failed", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The %s engine could not take the prefilled KV cache of engine %s: %s.",
		When: "A decode engine of a disaggregated request (docs/disaggregation.md) could not pull the KV blocks its prefill " +
			"engine computed: they expired, that engine restarted or cannot be reached. The worker runs the request " +
			"again with its own prefill before anything is streamed, so a client sees this only from an engine called " +
			"directly (the sim-server)."})
	ErrPrefillFailed = def(secBus, ErrorDef{Code: "prefill_failed", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The remote prefill of this request on worker %s failed: %s.",
		When: "A worker asked another for the prefill of a disaggregated request and got an error or no answer. The " +
			"worker then prefills the request itself, so a client sees this only in logs and traces."})
	ErrAdapterLoadFailed = def(secEngine, ErrorDef{Code: "adapter_load_failed", Status: http.StatusInternalServerError, Type: TypeServer, Param: "model",
		Message: "Cannot load LoRA adapter `%s`%s on worker %s: %s.",
		When:    "The engine refused to load the adapter (no weights at its path...): retrying does not help."})
	ErrAdapterLoadUnavailable = def(secEngine, ErrorDef{Code: "adapter_load_failed", Status: s503, Type: TypeOverloaded, RetryAfter: 1, Param: "model",
		Message: "Cannot load LoRA adapter `%s`%s on worker %s: %s.",
		When:    "The engine was down, overloaded or slow while loading the adapter: retry."})
	ErrAdaptersUnsupported = def(secEngine, ErrorDef{Code: "adapters_unsupported", Status: s400, Type: TypeInvalidRequest,
		Message: "Engine %s cannot load LoRA adapters.",
		When:    "A load or unload for an engine without a runtime LoRA API."})
	ErrAdapterNoPath = def(secEngine, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "The registry has no path for LoRA adapter `%s`.",
		When:    "An adapter registered without the path of its weights."})
	ErrAdapterBase = def(secEngine, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "This worker does not serve base model `%s`.",
		When:    "An adapter routed to a worker without its base model."})
	ErrAdapterName = def(secEngine, ErrorDef{Code: "missing_required_parameter", Status: s400, Type: TypeInvalidRequest,
		Message: "An adapter needs a name.",
		When:    "A load or unload without the adapter's name."})
	ErrAdapterIsBase = def(secEngine, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "'%s' is the base model.",
		When:    "A load of an adapter named like the engine's base model."})
	ErrAdapterLoaded = def(secEngine, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "The lora adapter '%s' has already been loaded.",
		When:    "The engine has the adapter already (vLLM's answer; the worker's manager takes it as a success)."})
	ErrAdapterNotFound = def(secEngine, ErrorDef{Code: "", Status: http.StatusNotFound, Type: TypeNotFound,
		Message: "The lora adapter '%s' cannot be found.",
		When:    "An unload of an adapter the engine does not have (vLLM's answer; a success for the worker)."})
	ErrAdapterSlotsFull = def(secEngine, ErrorDef{Code: "adapter_slots_full", Status: http.StatusConflict, Type: TypeInvalidRequest,
		Message: "All %d LoRA adapter slots are in use.",
		When:    "The sim engine's slots are full (the worker's manager evicts before it loads)."})
	ErrEngineNoEndpoint = def(secEngine, ErrorDef{Code: "unsupported_endpoint", Status: http.StatusNotFound, Type: TypeInvalidRequest,
		Message: "The %s engine behind this model does not serve %s.",
		When: "The engine answered 404 with no error of its own to /v1/embeddings, /tokenize or /detokenize: an OpenAI-compatible " +
			"server without that endpoint (vLLM has /tokenize; many others do not). A generative vLLM model answers embeddings with its own 400."})
	ErrUpstream = def(secEngine, ErrorDef{Status: 0, Type: "the engine's",
		Message: "The engine's message.",
		When: "Any other error an engine answered (a 4xx for a field it refuses, its own 5xx) keeps the engine's status, " +
			"message, type and code, in OpenAI's nested shape whatever shape the engine used (schemas.FromUpstream)."})
)

// --- API keys, limits, the control plane ---
var (
	ErrMissingKey = def(secControl, ErrorDef{Code: "invalid_api_key", Status: http.StatusUnauthorized, Type: TypeInvalidRequest,
		Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth " +
			"(i.e. Authorization: Bearer YOUR_KEY).",
		When: "--auth is on and the request has no Bearer token."})
	ErrInvalidKey = def(secControl, ErrorDef{Code: "invalid_api_key", Status: http.StatusUnauthorized, Type: TypeInvalidRequest,
		Message: "Incorrect API key provided: %s.",
		When:    "The key is not a tokenbus key or is unknown (the message shows only its ends)."})
	ErrTooManyAuthFailures = def(secControl, ErrorDef{Code: "too_many_auth_failures", Status: http.StatusTooManyRequests, Type: TypeRateLimit,
		Message: "Too many failed authentication attempts from this address or with this key prefix. Please try again in %ds.",
		When: "Failed API key or admin token checks from the client's address (or with the presented key's first characters) " +
			"passed the throttle's limit; Retry-After says when the block ends. The credential was not checked."})
	ErrModelNotAllowed = def(secControl, ErrorDef{Code: "model_not_allowed", Status: http.StatusForbidden, Type: TypePermission, Param: "model",
		Message: "This API key may not use the model `%s`.",
		When:    "The key's model list does not have the model."})
	ErrRateLimited = def(secControl, ErrorDef{Code: "rate_limit_exceeded", Status: http.StatusTooManyRequests, Type: TypeRateLimit,
		Message: "Rate limit reached for API key %s on %s: Limit %d, Used %d. Please try again in %s.",
		When:    "The key is over its requests or tokens per minute; Retry-After says when the window resets."})
	ErrStoreUnavailable = def(secControl, ErrorDef{Code: "store_unavailable", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "The control-plane store (Redis) is unavailable; try again shortly.",
		When:    "Redis does not answer and the answer is not cached (a key never seen, an admin API call)."})
	ErrConflict = def(secControl, ErrorDef{Code: "conflict", Status: http.StatusConflict, Type: TypeInvalidRequest,
		Message: "%s",
		When:    "Admin API: the model or adapter exists with other settings; the message says which."})
	ErrKeyNotFound = def(secControl, ErrorDef{Code: "key_not_found", Status: http.StatusNotFound, Type: TypeInvalidRequest,
		Message: "No API key has the id `%s`.",
		When:    "Admin API: an unknown key id."})
	ErrBadAdminToken = def(secControl, ErrorDef{Code: "invalid_admin_token", Status: http.StatusUnauthorized, Type: TypeInvalidRequest,
		Message: "The admin API needs the admin token: Authorization: Bearer <admin token>.",
		When:    "Admin API: no or wrong admin token."})
	ErrWorkerNotFound = def(secControl, ErrorDef{Code: "worker_not_found", Status: http.StatusNotFound, Type: TypeInvalidRequest,
		Message: "No live worker has the id `%s`.",
		When:    "Admin API: a drain or adapter operation on a worker that is not heartbeating."})
	ErrWorkerUnreachable = def(secControl, ErrorDef{Code: "worker_unreachable", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Could not reach the worker %s: %s.",
		When:    "Admin API: the worker did not answer its control subject."})
	ErrWorkerCtlTimeout = def(secControl, ErrorDef{Code: "timeout", Status: http.StatusGatewayTimeout, Type: TypeTimeout,
		Message: "The worker %s did not answer %s within %s.",
		When:    "Admin API: a control operation outlasted --ctl-timeout."})
	ErrBadWorkerReply = def(secControl, ErrorDef{Code: "bad_worker_reply", Status: http.StatusBadGateway, Type: TypeServer,
		Message: "The worker %s answered %s with something that is not a control reply.",
		When:    "Admin API: a malformed control reply."})
	ErrTooManyTrafficStreams = def(secControl, ErrorDef{Code: "too_many_streams", Status: http.StatusTooManyRequests, Type: TypeRateLimit, RetryAfter: 1,
		Message: "Too many traffic streams are open (at most %d); close one and try again.",
		When:    "Admin API: GET /events/traffic with its limit of open streams reached (each console page holds one)."})
	ErrInternal = def(secControl, ErrorDef{Code: "internal_error", Status: http.StatusInternalServerError, Type: TypeServer,
		Message: "Internal error: %s.",
		When:    "A fault of tokenbus itself; it is logged."})
)

// --- Files and batches (the batch package, gateway/files.go, gateway/batches.go) ---
var (
	ErrFileNotFound = def(secBatch, ErrorDef{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "id",
		Message: "No such File object: %s",
		When:    "An unknown file id, or a file of another tenant (the same answer: whether it exists is not told)."})
	ErrBatchNotFound = def(secBatch, ErrorDef{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "id",
		Message: "No batch found with id '%s'.",
		When:    "An unknown batch id, or a batch of another tenant."})
	ErrFileTooLarge = def(secBatch, ErrorDef{Code: "file_too_large", Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Param: "file",
		Message: "File is too large: the limit is %d bytes.",
		When:    "An upload over --file-limit (default 200 MB, OpenAI's)."})
	ErrBadUpload = def(secBatch, ErrorDef{Status: s400, Type: TypeInvalidRequest,
		Message: "%s",
		When:    "POST /v1/files that is not multipart/form-data with a `file` part and a `purpose` field; the message says what is missing."})
	ErrBatchState = def(secBatch, ErrorDef{Status: http.StatusConflict, Type: TypeInvalidRequest,
		Message: "Cannot cancel a batch with status '%s'.",
		When:    "Cancel of a batch that has already ended (completed, failed, expired, cancelled)."})
	ErrBatchesOff = def(secBatch, ErrorDef{Code: "batches_unavailable", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Files and batches are unavailable: %s.",
		When:    "JetStream could not be reached or refused an operation (its store is down or still starting)."})
	ErrStorageFull = def(secBatch, ErrorDef{Code: "storage_full", Status: http.StatusInsufficientStorage, Type: TypeServer,
		Message: "The file store is full; delete files, or ask the operator for more room.",
		When: "The files bucket (--files-max-bytes) or JetStream's whole store has no room left for the write. " +
			"Deletes still work and free space at once."})
	ErrFileQuota = def(secBatch, ErrorDef{Code: "quota_exceeded", Status: http.StatusForbidden, Type: TypePermission, Param: "file",
		Message: "This tenant's %s quota is %d and %d are in use; delete files before uploading more.",
		When: "An upload over the tenant's file count or bytes quota (the admin API's PUT /tenants/{tenant}/quotas, " +
			"--quota-files, --quota-file-bytes); refused before the body is read when its Content-Length already passes it, " +
			"else as soon as the stream does (nothing of it is kept)."})
	ErrBatchQuota = def(secBatch, ErrorDef{Code: "quota_exceeded", Status: http.StatusTooManyRequests, Type: TypeRateLimit,
		Message: "This tenant has %d batches not yet ended, its quota; try again when one has ended.",
		When:    "POST /v1/batches with the tenant's batches quota of unfinished batches reached (--quota-batches, or the tenant's own)."})
	ErrTooManyUploads = def(secBatch, ErrorDef{Code: "too_many_uploads", Status: http.StatusTooManyRequests, Type: TypeRateLimit, RetryAfter: 1,
		Message: "This tenant has %d uploads in progress on this gateway, its limit; try again when one has finished.",
		When:    "POST /v1/files while the tenant's uploads on this gateway are at --uploads-per-tenant; refused before the body is read."})
	ErrUploadsBusy = def(secBatch, ErrorDef{Code: "uploads_busy", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "This gateway takes %d uploads at once and is at that; try again shortly.",
		When:    "POST /v1/files while the gateway's uploads are at --uploads-max; refused before the body is read."})
)

// --- Responses (the responses package, gateway/responses.go) ---
var (
	ErrResponseNotFound = def(secResponses, ErrorDef{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "id",
		Message: "Response with id '%s' not found.",
		When:    "An unknown response id, one stored with store:false, deleted, or a response of another tenant (the same answer)."})
	ErrItemNotFound = def(secResponses, ErrorDef{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "input",
		Message: "Item with id '%s' not found.",
		When:    "An item_reference in a response's input names no item of a stored response of the tenant (one stored with store:false, deleted, another tenant's, or an id this gateway did not make)."})
	ErrResponseInput = def(secResponses, ErrorDef{Code: "invalid_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Invalid '%s': %s.",
		When:    "POST /v1/responses with an input item, content part or tool tokenbus cannot translate to the engine's chat API (images, files, built-in tools), or background without store."})
	ErrResponseUnknownParam = def(secResponses, ErrorDef{Code: "unknown_parameter", Status: s400, Type: TypeInvalidRequest,
		Message: "Unknown parameter: '%s'.",
		When:    "POST /v1/responses with a field that is neither one of OpenAI's Responses API nor one of vLLM's Responses extras tokenbus passes on (docs/responses.md lists every field); param names it."})
	ErrResponseUnsupported = def(secResponses, ErrorDef{Code: "unsupported_parameter", Status: s400, Type: TypeInvalidRequest,
		Message: "Unsupported parameter: '%s' is not supported by tokenbus (%s).",
		When:    "POST /v1/responses with a Responses field tokenbus cannot serve set to something other than null (conversation, prompt, moderation, context_management...); param names it."})
	ErrResponseUnsupportedValue = def(secResponses, ErrorDef{Code: "unsupported_value", Status: s400, Type: TypeInvalidRequest,
		Message: "Unsupported value: '%s' does not support '%s' with tokenbus (%s).",
		When:    "POST /v1/responses with a value tokenbus cannot serve: an include other than message.output_text.logprobs, a service_tier above the default, reasoning.summary concise or detailed, text.verbosity other than medium...; param names the field (include[1], reasoning.summary)."})
	ErrResponseContextLength = def(secResponses, ErrorDef{Code: "context_length_exceeded", Status: s400, Type: TypeInvalidRequest, Param: "input",
		Message: "Your input exceeds the context window of this model. Please adjust your input and try again. (%s)",
		When: "POST /v1/responses with truncation \"disabled\" (the default) whose input and max_output_tokens do not fit the model's max_model_len, or with \"auto\" when even the last input item does not fit. " +
			"Counted with the engine's tokenizer (a tokenize request on the bus) when the estimate (4 bytes a token) comes near the limit, with the estimate alone for engines without one."})
	ErrResponseState = def(secResponses, ErrorDef{Status: s400, Type: TypeInvalidRequest,
		Message: "%s",
		When:    "Cancel of a response that is not a background one or has already ended; a stream of a response that was not created with background."})
	ErrResponsesOff = def(secResponses, ErrorDef{Code: "responses_unavailable", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "Stored responses are unavailable: %s.",
		When:    "JetStream could not be reached or refused an operation; store:false requests without background still work. Also a store:true response that could not be stored: answered with this error (in a stream, an `error` event), never a 200 that is gone afterwards."})
	ErrTooManyFollows = def(secResponses, ErrorDef{Code: "too_many_follows", Status: http.StatusTooManyRequests, Type: TypeRateLimit, RetryAfter: 1,
		Message: "Your tenant follows %d background responses or resumable streams on this gateway, its limit; close one and try again.",
		When:    "A streamed background response, GET /v1/responses/{id}?stream=true or a resumable chat stream while the tenant already follows --response-followers-per-tenant on this gateway (each follow holds a JetStream consumer)."})
	ErrFollowsFull = def(secResponses, ErrorDef{Code: "follows_unavailable", Status: s503, Type: TypeOverloaded, RetryAfter: 1,
		Message: "This gateway follows as many background responses and resumable streams as it may (%d); try again shortly.",
		When:    "The same with --response-followers reached on this gateway (all tenants together), or JetStream refused the follow's consumer."})
	ErrResponseQuota = def(secResponses, ErrorDef{Code: "quota_exceeded", Status: http.StatusTooManyRequests, Type: TypeRateLimit,
		Message: "Your tenant has %d %s, its quota; %s.",
		When:    "A stored, background or resumable request past the tenant's quota (--quota-stored-responses, --quota-background, --quota-resumable, or the tenant's own): checked before anything is written. The message says which quota and what frees it."})
	ErrStreamCancelled = def(secResponses, ErrorDef{Code: "stream_cancelled", Status: http.StatusConflict, Type: TypeInvalidRequest,
		Message: "The stream %s was cancelled.",
		When:    "In band: the last event of a resumable chat stream cancelled with POST /v1/chat/completions/{id}/cancel."})
	ErrKeyRevoked = def(secResponses, ErrorDef{Code: "api_key_revoked", Status: http.StatusUnauthorized, Type: TypeInvalidRequest,
		Message: "The API key %s that started this response was deleted; it was stopped.",
		When:    "In band: a background response or resumable stream whose key was deleted ends with it (response.failed, or the stream's last event), before its next step."})
	ErrResponseLost = def(secResponses, ErrorDef{Code: "response_failed", Status: http.StatusInternalServerError, Type: TypeServer,
		Message: "The response could not be run after %d attempts (%s).",
		When:    "In band: a background response or resumable stream whose runs kept failing (JetStream unavailable or full for many minutes) ends failed rather than vanish."})
)

// FromUpstream is an error an engine answered, kept as the engine said it
// (ErrUpstream in the catalogue): status, type, code, param and message.
func FromUpstream(status int, typ, code, param, msg string) *Error {
	return newError(status, typ, code, param, msg)
}
