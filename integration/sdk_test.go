package integration

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The official Python and Node SDKs, unchanged, against tokenbus dev.
// scripts/test installs them and sets TOKENBUS_TEST_PYTHON / TOKENBUS_TEST_NODE.
func TestOfficialSDKs(t *testing.T) {
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
		t.Run(tt.name, func(t *testing.T) {
			bin := os.Getenv(tt.env)
			if bin == "" {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s not set: run the tests with scripts/test, which installs the SDK", tt.env)
				}
				t.Skipf("%s not set: run scripts/test to install the official %s SDK", tt.env, tt.name)
			}
			out, err := exec.Command(bin, tt.script, d.URL).CombinedOutput()
			if err != nil || !strings.Contains(string(out), tt.ok) {
				t.Fatalf("%s SDK: %v\n%s", tt.name, err, out)
			}
		})
	}
}
