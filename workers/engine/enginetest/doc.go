// Package enginetest is the conformance suite of workers/engine: one table
// of the behaviours a worker relies on, which every engine runs. The sim
// runs it in-process; the vllm and openai engines run it over real HTTP
// against tokenbus's sim-server (SimServer), and against the fake vLLM
// (internal/fakevllm) for the faults a sim-server cannot produce; the
// openai engine also against each quirk fake (QuirkServer: the sim-server
// with one quirk of a real server, Quirks lists them). A new engine passes
// Run before it is wired in:
//
//	func TestConformance(t *testing.T) {
//		enginetest.Run(t, enginetest.Harness{New: newEngine, Model: "m",
//			Lacks: map[enginetest.Feature]string{enginetest.Adapters: "its server has no LoRA API"}})
//	}
//
// Each behaviour is a subtest on a fresh engine, as the worker drives one:
// requests carry the View the worker reads (but for the malformed bodies of
// "bad request", which an engine called directly must refuse itself).
// Engines differ only where their Harness says so: a feature an engine lacks
// is listed with the reason, and the behaviours that need it are skipped
// with that reason (t.Skip: `go test -v` lists them). Nothing is skipped
// silently, and a harness that claims a feature its engine lacks fails.
//
// Tokenbus imports: internal/fakevllm, internal/testenv, schemas, workers/engine, workers/engine/sim,
// workers/engine/sim/simserver.
package enginetest
