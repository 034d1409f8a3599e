package enginetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine"
)

// Feature is an optional part of the engine contract.
type Feature string

const (
	// Adapters: the engine implements engine.Adapters, so LoRA adapters
	// load, serve and unload at run time.
	Adapters Feature = "adapters"
	// StreamUsage: a stream's Result.Usage has the real counts even when the
	// client did not ask for a usage chunk (stream_options).
	StreamUsage Feature = "stream usage"
	// Faults: the engine talks to a server whose failures it must survive
	// (Harness.Faulty attaches it to the fake vLLM).
	Faults Feature = "faults"
	// Extensions: the server takes fields it does not know (ignore_eos,
	// x_...) as vLLM does. Without it the suite sends no ignore_eos (the
	// harness's server must still generate all of max_tokens) and expects a
	// field the server does not know to be a 400 naming it.
	Extensions Feature = "extensions"
	// Concurrency: the server runs requests at once. A server that runs one
	// at a time is put behind a worker that sends it one at a time
	// (--max-concurrency 1); the suite then never overlaps two requests.
	Concurrency Feature = "concurrency"
	// Choices: the server answers n > 1 with n choices (transformers serve
	// ignores n and answers one).
	Choices Feature = "choices"
	// ContextLimit: the server refuses a request over its context length
	// with a 400 (transformers serve starts generating).
	ContextLimit Feature = "context-limit"
	// Pooling: the server serves /v1/embeddings, /tokenize and /detokenize.
	Pooling Feature = "pooling"
)

var features = []Feature{Adapters, StreamUsage, Faults, Extensions, Concurrency, Choices, ContextLimit, Pooling}

// Harness is what the suite needs of an engine.
type Harness struct {
	// New starts the engine under test, ready: Health nil, serving Model
	// (Models may list it a little later). The suite closes it. A decode
	// step must take about a millisecond or more (SimConfig does), so that a
	// request of thousands of tokens is still running when the suite
	// cancels it.
	New func(t *testing.T) engine.Engine
	// Model is the base model New's engine serves.
	Model string
	// Faulty starts the engine attached to the fake vLLM at url (its root,
	// serving Model), for the behaviours that need a fault. Nil unless the
	// engine has the Faults feature.
	Faulty func(t *testing.T, url string) engine.Engine
	// Lacks names each feature the engine does not have, with the reason.
	Lacks map[Feature]string
}

// behaviour is one row of the table.
type behaviour struct {
	name   string
	needs  []Feature
	run    func(t *testing.T, h *Harness)
	unless Feature // run only when the engine lacks this feature ("": always)
}

// behaviours is the table.
var behaviours = []behaviour{
	{"models lists the served model", nil, testModels, ""},
	{"health is nil when up", nil, testHealth, ""},
	{"stream", nil, testStream, ""},
	{"include_usage", nil, testIncludeUsage, ""},
	{"stream usage without include_usage", []Feature{StreamUsage}, testStreamUsage, ""},
	{"whole response", nil, testWhole, ""},
	{"n choices", []Feature{Choices}, testN, ""},
	{"unknown fields are accepted", []Feature{Extensions}, testUnknownFields, ""},
	{"unknown fields are a 400 naming them", nil, testStrictFields, Extensions},
	{"concurrent requests", []Feature{Concurrency}, testConcurrent, ""},
	{"a long stream arrives whole", nil, testLongStream, ""},
	{"bad request", nil, testBadRequest, ""},
	{"unknown model", nil, testUnknownModel, ""},
	{"cancel", nil, testCancel, ""},
	{"sink error", nil, testSinkError, ""},
	{"deadline", nil, testDeadline, ""},
	{"close", nil, testClose, ""},
	{"adapters", []Feature{Adapters}, testAdapters, ""},
	{"upstream errors", []Feature{Faults}, testUpstreamErrors, ""},
	{"stream failures", []Feature{Faults}, testStreamFailures, ""},
	{"cancel reaches the server", []Feature{Faults}, testCancelUpstream, ""},
	{"embeddings, tokenize, detokenize", []Feature{Pooling}, testEmbeddings, ""},
	{"embeddings without them: 404 unsupported_endpoint", nil, testNoPooling, Pooling},
}

// Run runs every behaviour of the table against h's engine, each as a subtest.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Model == "" {
		t.Fatal("enginetest: the harness needs New and Model")
	}
	for f, why := range h.Lacks {
		if !slices.Contains(features, f) || why == "" {
			t.Fatalf("enginetest: Lacks[%q] = %q: a known feature, with the reason the engine lacks it", f, why)
		}
	}
	if _, lacks := h.Lacks[Faults]; lacks != (h.Faulty == nil) {
		t.Fatal("enginetest: set Faulty, or list Faults in Lacks with the reason, not both")
	}
	for _, b := range behaviours {
		t.Run(b.name, func(t *testing.T) {
			if _, lacks := h.Lacks[b.unless]; b.unless != "" && !lacks {
				t.Skipf("only for an engine without %s", b.unless)
			}
			for _, f := range b.needs {
				if why, lacks := h.Lacks[f]; lacks {
					t.Skipf("the engine lacks %s: %s", f, why)
				}
			}
			b.run(t, &h)
		})
	}
}

const (
	// waitLong bounds the waits for what must happen soon (Stats dropping
	// back, a model listed).
	waitLong = 5 * time.Second
	// promptly is how soon Generate must return once its request is ended;
	// the long requests the suite ends would run for several seconds more.
	promptly = 3 * time.Second
	// longTokens is a request that lasts: at a millisecond per decode step,
	// 8 seconds, well past promptly.
	longTokens = 8000
)

// short is the members of a short request: tokens tokens, every one of
// them (ignore_eos, where the server takes it).
func (h *Harness) short() string { return h.exactly(tokens) }

// long is the members of a request that lasts (longTokens).
func (h *Harness) long() string { return h.exactly(longTokens) }

func (h *Harness) exactly(n int) string {
	if _, lacks := h.Lacks[Extensions]; lacks {
		return fmt.Sprintf(`"max_tokens":%d`, n)
	}
	return fmt.Sprintf(`"max_tokens":%d,"ignore_eos":true`, n)
}

// start runs New and closes the engine after the test.
func start(t *testing.T, h *Harness) engine.Engine {
	t.Helper()
	e := h.New(t)
	t.Cleanup(func() { e.Close() })
	return e
}
