// Package dispatcher routes requests to workers. Any number of dispatchers
// share the request subjects in a queue group; each keeps its own live view of
// the workers (a fleet.Fleet) from heartbeats and done notices, forwards every
// request to the least-loaded worker serving its model, and queues it
// (bounded, priority then FIFO) when every such worker is full.
//
// Tokenbus imports: fleet, internal/tracing, registry, schemas.
package dispatcher
