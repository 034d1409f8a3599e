// Package schemas is the single source of tokenbus's wire protocol v1: NATS
// subjects, request headers, the reply-stream framing, control messages and the
// few OpenAI shapes the bus itself needs to read. docs/protocol.md describes the
// same protocol in prose and jsonschema/ describes its JSON bodies for clients
// written in other languages; keep all three in step.
package schemas
