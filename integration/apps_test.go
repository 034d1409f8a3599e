package integration

import (
	"strings"
	"testing"
)

// Application code, unchanged, against tokenbus dev (issue 36): the OpenAI
// Agents SDK runs an agent whose tool is called and whose answer uses the
// tool's result (Responses and Chat Completions models, streamed and not);
// the Python SDK's parse helpers get their pydantic object; LangChain's
// with_structured_output and bind_tools; the Vercel AI SDK's generateObject
// and a streamText with a tool. Once on the sim, once through the vllm
// engine to the sim behind vLLM's HTTP API (sim-server, the fake vLLM): the
// fields reach the engine as the clients sent them and its answers come
// back whole. How the sim answers (JSON valid against the schema, a tool
// call by a fixed rule, then the tool's result) is in docs/engines.md.
func TestApplicationClients(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{"sim", "vllm"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			var d *dev
			if engine == "vllm" {
				d = startDev(t, vllmEngine(startSimServer(t).URL()))
			} else {
				d = startDev(t)
			}
			for _, tt := range []struct {
				name, env, script, ok string
			}{
				{"python", "TOKENBUS_TEST_PYTHON", "clients/apps.py", "apps ok"},
				{"node", "TOKENBUS_TEST_NODE", "clients/apps.mjs", "vercel ai ok"},
			} {
				t.Run(tt.name, func(t *testing.T) {
					out := runSDK(t, tt.env, tt.ok, tt.script, d.URL, "llama-8b")
					t.Log(strings.TrimSpace(out))
				})
			}
		})
	}
}
