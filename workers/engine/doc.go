// Package engine defines what a worker needs from an inference engine. The
// engines themselves live in sub-packages: sim (built in, no GPU), vllm and
// openai (HTTP servers). Every engine passes the conformance suite of
// package enginetest, which tests this contract.
//
// Tokenbus imports: schemas.
package engine
