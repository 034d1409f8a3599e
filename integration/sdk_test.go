package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/program"
)

// The official Python and Node SDKs, unchanged, against tokenbus dev.
// scripts/test installs them and sets TOKENBUS_TEST_PYTHON / TOKENBUS_TEST_NODE.
func TestOfficialSDKs(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	tests := []struct {
		name, env, script, ok string
	}{
		{"python", "TOKENBUS_TEST_PYTHON", "clients/python_sdk.py", "python sdk ok"},
		{"node", "TOKENBUS_TEST_NODE", "clients/node_sdk.mjs", "node sdk ok"},
		// LangChain's OpenAIEmbeddings (langchain-openai, in the same venv)
		{"langchain", "TOKENBUS_TEST_PYTHON", "clients/langchain_embeddings.py", "langchain ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSDK(t, tt.env, tt.ok, tt.script, d.URL) })
	}
}

// TestBatchSDK is issue 16's SDK target: a 10,000-line batch through the
// official Python SDK's files and batches calls, unchanged, against dev
// with the sim.
func TestBatchSDK(t *testing.T) {
	if os.Getenv("TOKENBUS_TEST_PYTHON") == "" && os.Getenv("CI") == "" {
		t.Skip("TOKENBUS_TEST_PYTHON not set: run scripts/test to install the official Python SDK")
	}
	t.Parallel()
	lines := "10000"
	if testing.Short() {
		lines = "500"
	}
	d := startDev(t, func(c *program.DevConfig) {
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = time.Millisecond, time.Millisecond
		c.HTTP.Batch.MaxInFlight, c.HTTP.Batch.MaxPerBatch = 256, 256
	})
	out := runSDK(t, "TOKENBUS_TEST_PYTHON", "sdk ok", "clients/python_batch.py", d.URL, lines)
	t.Log(strings.TrimSpace(out))
}
