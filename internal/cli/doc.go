// Package cli implements the tokenbus subcommands. Each is a function
// run(ctx, args, stdout, stderr) error: flags (with environment fallbacks)
// become a program's config, package program starts it, and the command
// prints or logs where it listens and waits for a signal or for the program
// to end. Logging, the profiler and tracing are set up here: they belong to
// the process.
//
// Tokenbus imports: bench, dispatcher, internal/flagenv, internal/program, internal/tracing/otlp,
// workers/engine/sim.
package cli
