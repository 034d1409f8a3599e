package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository root (two levels above this file).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func repoPath(t testing.TB, rel ...string) string {
	return filepath.Join(append([]string{repoRoot(t)}, rel...)...)
}

func readFile(t testing.TB, rel ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, rel...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tokenbusFlags returns the flags of every tokenbus subcommand, read from
// docs/configuration.md. That file is generated from each command's --help and
// a test in program/cli fails when it is stale, so this list cannot drift
// from the code. Every TOKENBUS_<FLAG> variable the deployment sets must name
// one of them (flagenv ignores variables of unknown flags, so a typo would
// silently do nothing).
func tokenbusFlags(t testing.TB) map[string][]string {
	t.Helper()
	doc := string(readFile(t, "docs", "configuration.md"))
	out := map[string][]string{}
	flag := regexp.MustCompile(`^ {2,}(?:-\w, )?--([a-z0-9-]+)`)
	cmd := ""
	for _, line := range strings.Split(doc, "\n") {
		if c, ok := strings.CutPrefix(line, "## tokenbus "); ok {
			cmd = strings.TrimSpace(c)
			continue
		}
		if m := flag.FindStringSubmatch(line); m != nil && cmd != "" {
			out[cmd] = append(out[cmd], m[1])
		}
	}
	if len(out["gateway"]) == 0 || len(out["worker"]) == 0 {
		t.Fatal("docs/configuration.md lists no gateway or worker flags")
	}
	return out
}

// envToFlag turns TOKENBUS_NATS_URL into nats-url (flagenv.EnvName reversed).
func envToFlag(env string) (string, bool) {
	rest, ok := strings.CutPrefix(env, "TOKENBUS_")
	if !ok {
		return "", false
	}
	return strings.ToLower(strings.ReplaceAll(rest, "_", "-")), true
}

// checkTokenbusEnv reports every TOKENBUS_* variable that names no flag of cmd.
func checkTokenbusEnv(t *testing.T, where, cmd string, env []string) {
	t.Helper()
	flags, ok := tokenbusFlags(t)[cmd]
	if !ok {
		t.Errorf("%s: unknown tokenbus subcommand %q", where, cmd)
		return
	}
	for _, e := range env {
		f, ok := envToFlag(e)
		if !ok {
			continue
		}
		if slices.Contains(flags, f) {
			continue
		}
		t.Errorf("%s: %s names no flag of `tokenbus %s` (flags: %s)", where, e, cmd, strings.Join(flags, ", "))
	}
}
