// Package engine defines what a worker needs from an inference engine. The
// engines themselves live in sub-packages: sim (built in, no GPU), vllm and
// openai (HTTP servers).
//
// Tokenbus imports: schemas.
package engine
