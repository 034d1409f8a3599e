// Package testenv starts the real servers tests run against: a NATS server
// (the nats-server module, in-process, on a real TCP port) and a Redis server
// (the redis-server binary, as a child process). Helpers in the manner of
// nats-server's RunServer and checkFor.
//
// Tokenbus imports: internal/embedded, internal/tracing.
package testenv
