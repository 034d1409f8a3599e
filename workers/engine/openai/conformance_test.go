package openai

import (
	"testing"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// The openai engine against tokenbus's sim-server (an OpenAI-compatible
// server over real HTTP, with an API key; health and models from
// /v1/models), and against the fake vLLM for the faults.
func TestConformance(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Model: "llama",
		New: func(t *testing.T) engine.Engine {
			url := enginetest.SimServer(t, enginetest.SimConfig("llama"), simserver.Config{APIKeys: []string{"sk-1"}})
			return newEngine(t, Config{URL: url + "/v1", APIKey: "sk-1"})
		},
		// The fake vLLM keys what it saw by X-Request-Id: the ids go as they are.
		Faulty: func(t *testing.T, url string) engine.Engine {
			return newEngine(t, Config{URL: url, RequestID: httpengine.RequestIDRaw})
		},
		Lacks: map[enginetest.Feature]string{
			enginetest.Adapters: "an OpenAI-compatible server has no standard API to load adapters",
			enginetest.StreamUsage: "the server sends a stream's usage only when stream_options asks, and the engine " +
				"never changes the body: without it a stream is counted by its chunks",
		},
	})
}
