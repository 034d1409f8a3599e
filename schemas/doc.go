// Package schemas is the single source of tokenbus's wire protocol v1: NATS
// subjects, request headers, the reply-stream framing, control messages and
// the OpenAI shapes the bus itself reads. It holds, in one place each:
//
//   - the one reader of request bodies, ReadRequest (request.go), and of
//     stream chunks and responses, ReadChunk (chunk.go), on the one JSON
//     scanner (json.go): every process gives a body the same meaning;
//   - the error catalogue (catalog.go): every error tokenbus answers with,
//     its code, status, type, retry hint and message; docs/errors.md is
//     generated from it.
//
// docs/protocol.md describes the same protocol in prose and jsonschema/
// describes its JSON bodies for clients written in other languages; keep all
// three in step.
//
// Tokenbus imports: none.
package schemas
