package integration

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestResponsesSDK: the official Python SDK's Responses API calls,
// unchanged, against tokenbus dev (issue 17).
func TestResponsesSDK(t *testing.T) {
	bin := os.Getenv("TOKENBUS_TEST_PYTHON")
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("TOKENBUS_TEST_PYTHON not set: run the tests with scripts/test, which installs the SDK")
		}
		t.Skip("TOKENBUS_TEST_PYTHON not set: run scripts/test to install the official Python SDK")
	}
	d := startDev(t)
	out, err := exec.Command(bin, "clients/python_responses.py", d.URL).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "python responses ok") {
		t.Fatalf("python SDK responses: %v\n%s", err, out)
	}
}
