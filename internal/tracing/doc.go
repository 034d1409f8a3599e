// Package tracing is what tokenbus's components use to trace requests with
// OpenTelemetry: one span per request per hop (gateway → dispatcher → worker
// → HTTP engine), the W3C trace context carried in the NATS header
// traceparent and sent on to the engine. It depends on the OpenTelemetry API
// only; the SDK and the OTLP exporter are installed by package otlp (Setup),
// which only the commands import.
//
// Off (nothing installed) costs close to nothing: Start returns the context
// as it is and a no-op span, with no allocation. Components set span names
// and attributes behind span.IsRecording(), so nothing is built for a span
// nobody exports.
//
// The provider is process-wide, like otel's global one, but Start looks it up
// on every call (one atomic load), so a process may install, remove and
// install again (tests do) without tracers stuck on an old provider.
//
// Tokenbus imports: schemas.
package tracing
