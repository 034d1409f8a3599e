// Package openai is the engine for any OpenAI-compatible server (llama.cpp
// server, SGLang, TGI, another tokenbus): requests and answers pass through
// untouched (see httpengine). It knows no metrics and no LoRA API: its load
// is its own requests in flight. Models come from GET /v1/models unless
// listed in the Config; health is GET /v1/models unless HealthPath says
// otherwise (e.g. "/health").
//
// Tokenbus imports: workers/engine, workers/engine/httpengine.
package openai
