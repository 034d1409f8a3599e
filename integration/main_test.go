package integration

import (
	"os"
	"path/filepath"
	"testing"
)

// Most tests run in parallel (t.Parallel): each starts its own servers on
// ports picked at run time, and most of their time is waiting. Those that
// set what the process shares (t.Setenv, otel's tracer provider) or hold a
// time bound of a second or two that neighbours would eat into are not, and
// say so: go test runs them first, one at a time, then the parallel ones.
// scripts/test runs the package with -parallel 4 (the default is GOMAXPROCS).

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, bin := range []string{binPath, natsBin} {
		if bin != "" {
			_ = os.RemoveAll(filepath.Dir(bin))
		}
	}
	os.Exit(code)
}
