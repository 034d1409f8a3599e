package openai

import (
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// Config is httpengine.Config: URL (required unless Command has --port),
// APIKey, Models, HealthPath (default "/v1/models"), timeouts, Command...
type Config = httpengine.Config

// Engine is an OpenAI-compatible server as an engine.Engine.
type Engine = httpengine.Engine

var (
	_ engine.Engine         = (*Engine)(nil)
	_ engine.ContextLengths = (*Engine)(nil) // from the server's /v1/models, where it has max_model_len
)

// New starts the engine named "openai" on cfg. It does not wait for the
// server (see Engine.WaitReady). Its request ids go as UUIDs unless
// cfg.RequestID says otherwise (httpengine.RequestIDUUID). The body goes
// to the server as the client sent it, "model" added if it named none: no
// field of tokenbus's own (a strict server answers 422 to what it does not
// know, vLLM's ignore_eos included), see docs/engines.md.
func New(cfg Config) (*Engine, error) {
	cfg.KnownModelsOnly = true
	if cfg.RequestID == "" {
		cfg.RequestID = httpengine.RequestIDUUID
	}
	return httpengine.New("openai", cfg, httpengine.Hooks{})
}
