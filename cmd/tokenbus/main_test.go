package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The binary links what it runs, never what only tests use (a browser
// driver, the SDKs the compatibility tests drive, a schema validator, the
// test support packages): each would cost every first build, and the first
// `tokenbus dev` of a fresh checkout is mostly that build.
func TestLinksNoTestLibraries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/tokenbus/tokenbus/"
	testOnly := []string{
		"github.com/chromedp/", "github.com/openai/openai-go", "github.com/santhosh-tekuri/jsonschema",
		"github.com/coder/websocket", "net/http/httptest",
		module + "internal/testenv", module + "internal/fakevllm", module + "workers/engine/enginetest", module + "integration",
	}
	deps := strings.Fields(string(out))
	for _, p := range deps {
		for _, x := range testOnly {
			if strings.HasPrefix(p, x) {
				t.Errorf("cmd/tokenbus links %s, which only tests need", p)
			}
		}
	}
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), out)
	}
}
