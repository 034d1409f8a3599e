// Package program starts tokenbus programs. A program is one tokenbus
// process: a gateway, a dispatcher, a worker, the sim-server, or all of them
// in one, dev. Each starts as StartX(ctx, cfg) and returns a handle with
// Addr (the bound listen address, so a config may say ":0"), Wait (blocks
// until the program ends and returns the first error of any of its parts)
// and Close (a graceful stop with the bounds the program's config gives; it
// returns what Wait returns, and a second call returns the same again).
//
// ctx bounds the start only (connecting to NATS and Redis, waiting for an
// engine, for the parts to subscribe); a started program runs until Close,
// or until one of its parts fails: a Serve that returns, a dispatcher or
// worker whose Run returns an error. Then every other part is stopped in the
// program's shutdown order and Wait returns that error.
//
// Configs are plain Go values; DefaultGateway, DefaultDev and the others
// return the defaults the tokenbus command shows in --help, and zero values
// are not defaults (an empty Admin turns the admin API off, zero SimWorkers
// means no worker). A config's Log receives the program's logs; nil
// discards them. Logging format, the profiler and tracing belong to the
// process and stay with the caller (program/cli, or a test).
//
// A gateway serves the Files and Batches APIs when its NATS has JetStream
// (HTTPConfig.Batch) and runs a batch runner as one of its parts
// (batch.Runner: it sends batch lines through the gateway's client).
//
// Dev is a composition of the other programs: it starts an embedded NATS
// server and store, then a dispatcher, workers and a gateway through the
// same start functions, connected in-process and sharing the store, the
// model cache and one metrics registry.
//
// Imports: programs import the roles and what they run on: gateway,
// dispatcher, workers and their engines, admin, auth, registry, fleet,
// client, batch, schemas, and the internal helpers (natsconn, embedded). Nothing
// imports program but program/cli and tests.
//
// Tokenbus imports: admin, auth, batch, client, dispatcher, fleet, gateway, internal/embedded, internal/natsconn,
// registry, responses, schemas, usage, workers, workers/engine, workers/engine/httpengine, workers/engine/openai,
// workers/engine/sim, workers/engine/sim/simserver, workers/engine/vllm.
package program
