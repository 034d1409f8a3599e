package vllm

import (
	"testing"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// The vllm engine against tokenbus's sim-server (vLLM's API over real HTTP,
// with an API key and the runtime LoRA API), and against the fake vLLM for
// the faults.
func TestConformance(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Model: "base",
		New: func(t *testing.T) engine.Engine {
			url := enginetest.SimServer(t, enginetest.SimConfig("base"),
				simserver.Config{AllowRuntimeLoRA: true, APIKeys: []string{"sk-conformance"}})
			cfg := fastConfig(url + "/v1")
			cfg.APIKey = "sk-conformance"
			return newEngine(t, cfg)
		},
		Faulty: func(t *testing.T, url string) engine.Engine { return newEngine(t, fastConfig(url)) },
		Lacks: map[enginetest.Feature]string{
			enginetest.StreamUsage: "vLLM sends a stream's usage only when stream_options asks, and the engine " +
				"never changes the body: without it a stream is counted by its chunks",
		},
	})
}
