// Package otlp turns tracing on for a tokenbus process: an OpenTelemetry SDK
// tracer provider exporting over OTLP/HTTP (protobuf), installed for the
// components (package tracing) and as otel's global provider. Only the
// commands import it: the components depend on the OpenTelemetry API alone.
//
// Tokenbus imports: internal/tracing.
package otlp
