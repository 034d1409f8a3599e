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

var _ engine.Engine = (*Engine)(nil)

// New starts the engine named "openai" on cfg. It does not wait for the
// server (see Engine.WaitReady).
func New(cfg Config) (*Engine, error) {
	return httpengine.New("openai", cfg, httpengine.Hooks{})
}
