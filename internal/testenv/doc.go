// Package testenv is the tests' shared scaffolding: it starts the real
// servers tests run against, a NATS server (the nats-server module,
// in-process, on a real TCP port), a Redis server (the redis-server binary,
// as a child process), a Sentinel setup and a Redis Cluster of redis-server
// or valkey-server processes (redistopo.go) and an OTLP trace receiver; it holds the listeners a
// test points a client at where nothing may serve (ResetListener,
// SilentListener: no test trusts a port to be closed); and WaitFor is the one
// way a test waits for a condition. Helpers in the manner of nats-server's
// RunServer and checkFor. The fake vLLM server is internal/fakevllm; the
// suite every engine must pass is workers/engine/enginetest.
//
// Tokenbus imports: internal/embedded, internal/freeport, internal/tracing.
package testenv
