// Package chaos is the reliability harness of issue 13: it builds tokenbus
// and nats-server once, starts real processes (NATS servers, redis-server,
// gateways, dispatchers, sim workers) on ports picked at run time, runs
// streaming load against the gateways, injects one fault per scenario (kill
// -9 of a worker, a gateway, a dispatcher, a NATS cluster node, a NATS
// restart, a Redis kill) and measures what clients saw: streams completed
// and failed by error code, tokens lost or repeated (every stream asks the
// sim for the same deterministic text, compared with a reference stream),
// the longest gap between chunks, and how a request sent right after the
// fault fared. Retries and migrations are read from the processes' /metrics
// when the product exports such counters.
//
// It drives the binaries from outside, as an operator's kill would, so it
// imports no tokenbus package. scripts/chaos runs it (cmd/chaos);
// integration's chaos test runs a small scenario in CI; docs/reliability.md
// has the figures.
//
// Tokenbus imports: internal/freeport.
package chaos
