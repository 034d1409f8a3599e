// Package embedded starts the servers `tokenbus dev` runs in-process: a NATS
// server with JetStream and a Redis-compatible store.
//
// Tokenbus imports: none.
package embedded
