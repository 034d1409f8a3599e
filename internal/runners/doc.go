// Package runners runs functions on goroutines kept from earlier calls.
//
// A new goroutine starts with a small stack. A request's path through the
// gateway (fasthttp, Fiber, the handler) or the worker (the engine's HTTP
// client) needs more, so a goroutine per request copied its stack to a
// bigger one once or twice per request: 7 % of tokenbus dev's CPU on a
// zero-latency engine (pprof: runtime.newstack). A kept goroutine grows its
// stack once (until a garbage collection shrinks it).
//
// Tokenbus imports: none.
package runners
