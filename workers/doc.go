// Package workers is the worker runtime: it takes requests forwarded by
// dispatchers on its work subject, admits them up to a hard cap, runs them on
// an engine and publishes the reply stream, and tells the dispatchers about
// itself with heartbeats and done notices.
//
// Tokenbus imports: internal/tracing, schemas, workers/engine, workers/lora.
package workers
