package integration

import (
	"os"
	"path/filepath"
	"testing"
)

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
