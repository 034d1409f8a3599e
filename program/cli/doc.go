// Package cli implements the tokenbus subcommands. Each is a function
// run(ctx, args, stdout, stderr) error: flags (with environment fallbacks)
// become a program's config, package program starts it, and the command
// prints or logs where it listens and waits for a signal or for the program
// to end. Logging, the profiler and tracing are set up here: they belong to
// the process. So is go-redis's logger, which the commands route into the
// log (redislog.go). The logger a command hands to its program has no
// component: the program names its components itself, once per line.
//
// Tokenbus imports: bench, dispatcher, internal/flagenv, program/natsusers,
// internal/tracing/otlp, program, registry, schemas, workers/engine/httpengine, workers/engine/sim.
package cli
