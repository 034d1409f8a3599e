package openai

import (
	"os"
	"strings"
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

// The openai engine against each quirk fake: the sim-server with one quirk
// of a real server. Each lacks what the main harness lacks, and the faults
// (the fake vLLM's, run above); the strict one also lacks Extensions, the
// one-at-a-time one Concurrency.
func TestConformanceQuirks(t *testing.T) {
	for _, q := range enginetest.Quirks {
		t.Run(string(q), func(t *testing.T) {
			lacks := map[enginetest.Feature]string{
				enginetest.Adapters:    "an OpenAI-compatible server has no standard API to load adapters",
				enginetest.StreamUsage: "a stream's usage comes only when stream_options asks",
				enginetest.Faults:      "the faults run against the fake vLLM (TestConformance); this fake shows one quirk",
			}
			switch q {
			case enginetest.QuirkStrict:
				lacks[enginetest.Extensions] = "the server refuses fields outside OpenAI's API with a 422"
				lacks[enginetest.Pooling] = "the server has no /v1/embeddings, /tokenize, /detokenize"
			case enginetest.QuirkOneAtATime:
				// newEngine probes health every 10ms and the model list every
				// 50ms: hundreds of chances to cut a stream, were they sent
				// while one runs.
				lacks[enginetest.Concurrency] = "the server runs one request at a time and cuts the running " +
					"stream for the next: a worker sends it one at a time (--max-concurrency 1)"
			}
			enginetest.Run(t, enginetest.Harness{
				Model: "llama",
				New: func(t *testing.T) engine.Engine {
					url := enginetest.QuirkServer(t, enginetest.SimConfig("llama"), simserver.Config{}, q)
					return newEngine(t, Config{URL: url})
				},
				Lacks: lacks,
			})
		})
	}
}

// The openai engine against a server already running: the suite's rows for
// a real engine. scripts/gpu-check runs this test's binary against
// transformers serve on a GPU host. TOKENBUS_CONFORMANCE_URL is the server's
// root, TOKENBUS_CONFORMANCE_MODEL the model it serves, and
// TOKENBUS_CONFORMANCE_LACKS the features it lacks, comma-separated
// (enginetest's names: "extensions" for a server that refuses fields outside
// OpenAI's API, "concurrency" for one that runs a request at a time,
// "choices", "context-limit", "pooling"; transformers serve lacks all but
// concurrency).
func TestConformanceServer(t *testing.T) {
	url, model := os.Getenv("TOKENBUS_CONFORMANCE_URL"), os.Getenv("TOKENBUS_CONFORMANCE_MODEL")
	if url == "" || model == "" {
		t.Skip("TOKENBUS_CONFORMANCE_URL and TOKENBUS_CONFORMANCE_MODEL name a running server to test against")
	}
	lacks := map[enginetest.Feature]string{
		enginetest.Adapters:    "an OpenAI-compatible server has no standard API to load adapters",
		enginetest.StreamUsage: "a stream's usage comes only when stream_options asks",
		enginetest.Faults:      "the faults run against the fake vLLM (TestConformance)",
	}
	for f := range strings.SplitSeq(os.Getenv("TOKENBUS_CONFORMANCE_LACKS"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			lacks[enginetest.Feature(f)] = "TOKENBUS_CONFORMANCE_LACKS says the server lacks it"
		}
	}
	enginetest.Run(t, enginetest.Harness{
		Model: model,
		New: func(t *testing.T) engine.Engine {
			return newEngine(t, Config{URL: url, Models: []string{model}})
		},
		Lacks: lacks,
	})
}
