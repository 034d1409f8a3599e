// Package usage makes usage records durable: every finished request's
// schemas.UsageRecord goes to the JetStream stream TOKENBUS_USAGE (subjects
// schemas.UsagePrefix + <source>) with a publish ack, and a durable pull
// consumer in every process that has Redis (the gateways, sharing it as a
// work queue) writes each record to Redis and acks it only once Redis took
// it. A Redis outage leaves the records in the stream until Redis is back;
// a record delivered twice counts once (the recorder is idempotent by
// request id, registry.Limiter.RecordBatch).
//
// Records travel in batches: a publisher holds a record up to
// PublisherConfig.Linger (200 ms) for others to share its message (JSON
// Lines, at most 256 records), and the consumer writes a message's records
// in one Redis call, summed by key, model and reservation window
// (registry.Limiter.RecordBatch). One JetStream
// publish, ack and Redis script per request was most of the CPU the gateway
// spent per request on usage; in `tokenbus dev`, whose embedded store makes
// a Lua state and buffers for every script and every redis.call in it, it
// was a fifth of the process's CPU.
//
// A Publisher needs only a *nats.Conn, so workers publish the usage of
// NATS-native requests the same way gateways publish that of HTTP ones.
// While JetStream cannot take a record (down, or the stream full), the
// publisher holds it in a bounded memory buffer and retries; past the
// buffer, or at Close, what is left is dropped, counted in
// tokenbus_usage_dropped_total and logged. A gateway's publisher may also
// write a record straight to Redis when JetStream refuses it (Fallback).
//
// Tokenbus imports: schemas.
package usage
