// Package workers is the worker runtime: it takes requests forwarded by
// dispatchers on its work subject, admits them up to a hard cap, runs them on
// an engine and publishes the reply stream, and tells the dispatchers about
// itself with heartbeats and done notices. A request a dispatcher routed by
// prefix carries its prediction of the engine's cached prompt tokens; the
// worker sets it against the engine's report when the request ends
// (prefixcache.go).
//
// Tokenbus imports: internal/runners, internal/tracing, schemas, workers/engine, workers/lora.
package workers
