// Package client is the Go client of tokenbus's NATS protocol. The gateway
// uses it, and so can any Go program that wants to skip HTTP: publish an
// OpenAI request body, read the reply stream frame by frame.
//
// Every request kind goes the same way (Request.Kind): chat and completion
// stream chunks (with stream: true) and end with a done frame; embedding,
// tokenize and detokenize (schemas.KindEmbedding...) send no chunk, and their
// done frame's payload is the whole response body, as for a stream:false
// chat. Such a request whose worker fails is sent again whole (there is
// nothing to continue).
//
// One Client holds one wildcard subscription on its inbox prefix and routes
// replies to streams through a map: a subscription per stream would cost
// about 512 KB and several microseconds per token.
//
// A stream whose worker fails (WorkerLost, a gap, a stall, a retryable error
// frame) is sent to another worker transparently: retried before its first
// chunk, continued (migrated) after it, at most Options.MigrationLimit times
// (failover.go, docs/migration.md). A stream whose engine returns token ids
// (vLLM, asked through schemas.HdrTokenIDs; tokenids.go) is continued from
// them exactly, on the completions endpoint, and spliced back into the
// reader's shape with the engine's key order (continuation.go, splice.go);
// the reader gets the chunks as the engine writes them unasked.
//
// Tokenbus imports: schemas.
package client
