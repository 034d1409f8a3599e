package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
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

// The flags of each tokenbus subcommand, as defined in internal/cli and
// internal/natsconn. Every TOKENBUS_<FLAG> variable the deployment sets must
// name one of them (flagenv ignores variables of unknown flags, so a typo
// would silently do nothing). TestFlagListMatchesSource keeps this list
// honest: each name must still appear as a flag literal in those sources.
var (
	natsFlags = []string{"nats-url", "nats-creds", "nats-user", "nats-password", "nats-token", "nats-nkey",
		"nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-inbox-prefix"}
	logFlags    = []string{"log-level", "log-format"}
	engineFlags = []string{"engine", "model", "sim-prefill-base", "sim-prefill-per-token", "sim-decode-base",
		"sim-decode-per-seq", "sim-max-num-seqs", "sim-kv-blocks", "sim-block-size", "sim-max-model-len",
		"sim-max-loras", "sim-lora-load-time"}
	gatewayOwn    = []string{"http", "body-limit", "request-timeout", "shutdown-timeout"}
	dispatcherOwn = []string{"dispatcher-id", "queue-size", "queue-timeout"}

	tokenbusFlags = map[string][]string{
		"gateway":    concat(gatewayOwn, natsFlags, []string{"redis-url"}, logFlags),
		"dispatcher": concat(natsFlags, dispatcherOwn, []string{"redis-url", "metrics"}, logFlags),
		"worker":     concat(natsFlags, []string{"id", "max-concurrency", "drain-timeout", "redis-url"}, engineFlags, logFlags),
		"dev": concat(gatewayOwn, []string{"nats-listen", "redis-url", "data-dir", "sim-workers", "max-concurrency",
			"drain-timeout"}, engineFlags, dispatcherOwn, logFlags),
	}

	// Flags the deployment already sets for features that are announced but
	// not written yet; flagenv ignores their variables until they exist.
	plannedFlags = map[string][]string{
		"gateway": {"admin", "admin-token"}, // admin API on :8081
		"worker":  {"engine-url"},           // --engine vllm|openai --engine-url http://vllm:8000
	}
)

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
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
	flags, ok := tokenbusFlags[cmd]
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
		if slices.Contains(plannedFlags[cmd], f) {
			t.Logf("%s: %s is for the planned flag --%s of tokenbus %s", where, e, f, cmd)
			continue
		}
		t.Errorf("%s: %s names no flag of `tokenbus %s` (flags: %s)", where, e, cmd, strings.Join(flags, ", "))
	}
}

func TestFlagListMatchesSource(t *testing.T) {
	root := repoRoot(t)
	var b strings.Builder
	for _, pattern := range []string{"internal/cli/*.go", "internal/natsconn/*.go"} {
		files, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(src)
		}
	}
	src := b.String()
	if src == "" {
		t.Fatal("no sources under internal/cli and internal/natsconn")
	}
	// Flag definitions look like fs.StringVar(&x, "name", ...) or fs.Int("name", ...).
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`\.(?:String|Int|Int64|Bool|Duration|Float64|StringSlice|Uint)(?:Var)?\((?:&[\w.]+, )?"([a-z0-9-]+)"`).FindAllStringSubmatch(src, -1) {
		defined[m[1]] = true
	}
	var missing []string
	all := map[string]bool{}
	for cmd, flags := range tokenbusFlags {
		for _, f := range flags {
			all[f] = true
			if !defined[f] {
				missing = append(missing, cmd+" --"+f)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("flags in this test's list that internal/cli and internal/natsconn no longer define: %s", strings.Join(slices.Compact(missing), ", "))
	}
	for _, flags := range plannedFlags {
		for _, f := range flags {
			all[f] = true
		}
	}
	var unlisted []string
	for f := range defined {
		if !all[f] {
			unlisted = append(unlisted, f)
		}
	}
	sort.Strings(unlisted)
	if len(unlisted) > 0 {
		t.Errorf("flags defined in internal/cli or internal/natsconn that this test does not list (add them to tokenbusFlags or plannedFlags): %s",
			strings.Join(unlisted, ", "))
	}
	for cmd, flags := range plannedFlags {
		for _, f := range flags {
			if defined[f] {
				t.Logf("planned flag --%s of %s now exists: move it to tokenbusFlags", f, cmd)
			}
		}
	}
}
