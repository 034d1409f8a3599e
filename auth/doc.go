// Package auth implements the gateway's Authorize and OnUsage hooks on the
// registry: API keys (Authorization: Bearer tb-...), per-key model
// allow-lists, requests- and tokens-per-minute limits shared by every gateway
// replica through Redis, and usage per key and model.
//
// Answers, all in OpenAI's error shape:
//
//	no key, or not a key         401 invalid_request_error, code invalid_api_key
//	too many wrong keys          429 rate_limit_error, code too_many_auth_failures, Retry-After
//	                             (per client address and key prefix: gateway.Throttle)
//	model not in the key's list  403 permission_error, code model_not_allowed, param model
//	over RPM or TPM              429 rate_limit_error, code rate_limit_exceeded, Retry-After
//	Redis down, key not cached   503 overloaded_error, code store_unavailable
//
// GET /v1/models needs a key too (ModelAccess) and lists only the key's
// models and adapters; no rate limit applies to it.
//
// Keys with limits get OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// headers on every response, for the limits they have. Admission reserves
// (registry.Limiter.Admit): a prompt array counts one request per prompt,
// and the request's prompt estimate plus the most it may generate is
// reserved against TPM, settled when its usage record is written. Admit is
// the same check without Fiber, for requests that do not come over HTTP.
// Redis down during the limit check fails open: the request is allowed, a
// warning is logged and tokenbus_auth_ratelimit_fail_open_total counts it,
// so a Redis outage does not stop serving; Config.FailClosed refuses with
// 503 instead. Usage records go to Config.Usage (the gateway program: a
// usage.Publisher) or, without it, straight to Redis.
//
// Tokenbus imports: gateway, registry, schemas.
package auth
