package validate

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

const dockerfile = "deploy/Dockerfile"

// parseDockerfile parses deploy/Dockerfile with BuildKit's own parser and
// runs BuildKit's lint rules (what `docker build --check` reports).
func parseDockerfile(t *testing.T) ([]instructions.Stage, []instructions.ArgCommand) {
	t.Helper()
	res, err := parser.Parse(bytes.NewReader(readFile(t, dockerfile)))
	if err != nil {
		t.Fatalf("%s: %v", dockerfile, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", dockerfile, w.Short)
	}
	var lints []string
	lint := linter.New(&linter.Config{ExperimentalAll: true, Warn: func(rule, desc, url, msg string, _ []parser.Range) {
		lints = append(lints, rule+": "+msg)
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", dockerfile, err)
	}
	for _, l := range lints {
		t.Errorf("%s: lint %s", dockerfile, l)
	}
	// BuildKit parses RUN --mount only when it expands a stage for a build:
	// every RUN (all in the builder) must mount the module cache, as written.
	for _, n := range res.AST.Children {
		if n.Value == "run" && !slices.ContainsFunc(n.Flags, func(f string) bool {
			return strings.HasPrefix(f, "--mount=") && strings.Contains(f, "type=cache") && strings.Contains(f, "target=/go/pkg/mod")
		}) {
			t.Errorf("%s line %d: RUN without the module cache mount (--mount=type=cache,target=/go/pkg/mod)", dockerfile, n.StartLine)
		}
	}
	return stages, metaArgs
}

func argDefault(args []instructions.ArgCommand, name string) string {
	for _, a := range args {
		for _, kv := range a.Args {
			if kv.Key == name && kv.Value != nil {
				return *kv.Value
			}
		}
	}
	return ""
}

func TestDockerfile(t *testing.T) {
	stages, metaArgs := parseDockerfile(t)
	if len(stages) != 2 {
		t.Fatalf("%d stages, want build and runtime", len(stages))
	}
	build, final := stages[0], stages[1]

	// Builder: the Go of go.mod.
	goMod := string(readFile(t, "go.mod"))
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(goMod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	if build.BaseName != "golang:${GO_VERSION}" || argDefault(metaArgs, "GO_VERSION") != m[1] {
		t.Errorf("builder %s with GO_VERSION=%s, want golang:${GO_VERSION} with go.mod's %s", build.BaseName, argDefault(metaArgs, "GO_VERSION"), m[1])
	}
	var runs []string
	var env []string
	for _, c := range build.Commands {
		switch c := c.(type) {
		case *instructions.RunCommand:
			runs = append(runs, strings.Join(c.CmdLine, " "))

		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env = append(env, kv.Key+"="+kv.Value)
			}
		}
	}
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Error("builder does not set CGO_ENABLED=0 (the runtime image has no libc)")
	}
	goBuild := strings.Join(runs, "\n")
	for _, want := range []string{"-trimpath", "-s -w", "-X github.com/tokenbus/tokenbus/program/cli.Version=${VERSION}",
		"-o /out/tokenbus ./cmd/tokenbus", "-o /out/tokenbus-probe ./deploy/probe"} {
		if !strings.Contains(goBuild, want) {
			t.Errorf("go build lacks %q", want)
		}
	}
	// The -X target exists.
	if !regexp.MustCompile(`(?m)^var Version = `).Match(readFile(t, "program/cli/cli.go")) {
		t.Error("program/cli.Version, set by -ldflags -X, is gone")
	}
	for _, pkg := range []string{"cmd/tokenbus", "deploy/probe"} {
		files, _ := filepath.Glob(repoPath(t, pkg, "*.go"))
		if len(files) == 0 {
			t.Errorf("%s: no Go files to build", pkg)
		}
	}

	// Runtime: distroless static, non-root, exec-form entrypoint, no shell.
	if final.BaseName != "${RUNTIME_IMAGE}" || !strings.HasPrefix(argDefault(metaArgs, "RUNTIME_IMAGE"), "gcr.io/distroless/static") ||
		!strings.HasSuffix(argDefault(metaArgs, "RUNTIME_IMAGE"), ":nonroot") {
		t.Errorf("runtime image %s (%s): want distroless static, nonroot", final.BaseName, argDefault(metaArgs, "RUNTIME_IMAGE"))
	}
	var user string
	var entrypoint, cmd *instructions.ShellDependantCmdLine
	copied := map[string]bool{}
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.RunCommand:
			t.Errorf("RUN %s in the runtime stage: distroless has no shell", c.CmdLine)
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			entrypoint = &c.ShellDependantCmdLine
		case *instructions.CmdCommand:
			cmd = &c.ShellDependantCmdLine
		case *instructions.HealthCheckCommand:
			if len(c.Health.Test) > 0 && c.Health.Test[0] == "CMD-SHELL" {
				t.Error("HEALTHCHECK in shell form: distroless has no shell")
			}
		case *instructions.CopyCommand:
			if c.From == "build" {
				for _, src := range c.SourcePaths {
					copied[src] = true
				}
			}
		}
	}
	if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Errorf("USER %q: want a non-root user", user)
	}
	if entrypoint == nil || entrypoint.PrependShell || !slices.Equal(entrypoint.CmdLine, []string{"/tokenbus"}) {
		t.Errorf("ENTRYPOINT: want exec form [\"/tokenbus\"]")
	}
	if cmd == nil || cmd.PrependShell || len(cmd.CmdLine) == 0 {
		t.Error("CMD: want exec form with a subcommand")
	} else if _, ok := tokenbusFlags(t)[cmd.CmdLine[0]]; !ok {
		t.Errorf("CMD %q: not a tokenbus subcommand", cmd.CmdLine)
	}
	for _, bin := range []string{"/out/tokenbus", "/out/tokenbus-probe"} {
		if !copied[bin] {
			t.Errorf("the runtime stage does not copy %s", bin)
		}
	}
}

// TestDockerignore: the build context keeps every file the build needs and
// none of the secrets or bulk.
func TestDockerignore(t *testing.T) {
	root := repoRoot(t)
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	ignored := func(rel string) bool {
		ok, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// The Go files of every package the two binaries are built from, as the
	// go command lists them (-e: a package missing from this branch is no error here).
	cmd := exec.Command("go", "list", "-e", "-deps", "-f", `{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`,
		"./cmd/tokenbus", "./deploy/probe")
	cmd.Dir = root
	// Read-only: the test must never touch the product's go.mod.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	need := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		rel, err := filepath.Rel(root, fields[0])
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module dependency, not in the context
		}
		for _, f := range fields[1:] {
			need = append(need, filepath.Join(rel, f))
		}
	}
	if len(need) < 10 {
		t.Fatalf("go list found only %v", need)
	}
	for _, f := range need {
		if ignored(f) {
			t.Errorf(".dockerignore excludes %s, which the build needs", f)
		}
	}
	for _, f := range []string{".git/config", ".env", "deploy/nats/tenant-b.nk", "deploy/validate/go.mod",
		"deploy/helm/tokenbus/values.yaml", "integration/clients/node_modules/x", ".cache/venv/bin/python",
		"deploy/probe/main_test.go", "tokenbus"} {
		if !ignored(f) {
			t.Errorf(".dockerignore lets %s into the build context", f)
		}
	}
}
