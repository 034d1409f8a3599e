package layout

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/tokenbus/tokenbus/"

// layers: a package may import packages of lower layers, and of its own
// layer only along the edges in allowed. Test-only packages (testenv, the
// fake vLLM, integration) are outside the layers: only tests import them.
var layers = map[string]int{
	"schemas": 0,

	"client": 1, "fleet": 1, "registry": 1, "usage": 1, "batch": 1, "responses": 1,
	"internal/tracing": 1, "internal/tracing/otlp": 1, "internal/natsconn": 1, "internal/embedded": 1,
	"scheduler": 1, "internal/flagenv": 1, "internal/gctune": 1, "internal/sysmon": 1, "internal/decay": 1, "internal/runners": 1, "internal/freeport": 1,

	"gateway": 2, "gateway/httpstream": 2, "dispatcher": 2, "admin": 2, "auth": 2, "bench": 2, "program/natsusers": 2,
	"workers": 2, "workers/lora": 2, "workers/engine": 2, "workers/engine/httpengine": 2,
	"workers/engine/openai": 2, "workers/engine/vllm": 2, "workers/engine/sim": 2, "workers/engine/sim/simserver": 2,

	"program": 3, "program/cli": 3, "cmd/tokenbus": 3, "deploy/probe": 3, "examples/natsclient": 3,
	"internal/layout": 3, "program/chaos": 3, "cmd/chaos": 3,
}

var testOnly = []string{"internal/testenv", "internal/fakevllm", "workers/engine/enginetest", "integration"}

// allowed are the imports within a layer: each goes from a package to one
// it builds on, never back.
var allowed = map[string][]string{
	"internal/tracing/otlp":        {"internal/tracing"},
	"batch":                        {"client"}, // runs lines through the bus
	"responses":                    {"client"}, // one chat request through the bus per response
	"gateway":                      {"gateway/httpstream"},
	"admin":                        {"gateway"}, // its errors and HTTP conventions
	"auth":                         {"gateway"}, // the gateway's hooks
	"workers":                      {"workers/engine", "workers/lora"},
	"workers/lora":                 {"workers/engine"},
	"workers/engine/httpengine":    {"workers/engine"},
	"workers/engine/openai":        {"workers/engine", "workers/engine/httpengine"},
	"workers/engine/vllm":          {"workers/engine", "workers/engine/httpengine"},
	"workers/engine/sim":           {"workers/engine"},
	"workers/engine/sim/simserver": {"workers/engine", "workers/engine/sim"},
	"program/cli":                  {"program"},
	"cmd/tokenbus":                 {"program/cli"},
	"cmd/chaos":                    {"program/chaos"},
}

// packages maps every package of the module (by path below the module) to
// the tokenbus packages its non-test files import.
func packages(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n != "." && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules" ||
				path == filepath.Join(root, "deploy", "validate")) {
				return filepath.SkipDir // deploy/validate is a module of its own
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		imps := out[rel]
		for _, s := range f.Imports {
			p, _ := strconv.Unquote(s.Path.Value)
			if q, ok := strings.CutPrefix(p, module); ok && !slices.Contains(imps, q) {
				imps = append(imps, q)
			}
		}
		slices.Sort(imps)
		out[rel] = imps
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Imports run one way: programs → roles → shared state and helpers →
// protocol; nothing but tests imports the test helpers.
func TestImportsRunOneWay(t *testing.T) {
	for pkg, imps := range packages(t) {
		if slices.Contains(testOnly, pkg) {
			continue
		}
		lp, ok := layers[pkg]
		if !ok {
			t.Errorf("%s is in no layer: add it to layers here and to docs/architecture.md", pkg)
			continue
		}
		for _, imp := range imps {
			li, ok := layers[imp]
			switch {
			case slices.Contains(testOnly, imp):
				t.Errorf("%s imports %s, which only tests may", pkg, imp)
			case !ok:
				t.Errorf("%s imports %s, which is in no layer", pkg, imp)
			case li > lp:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports run down, never up", pkg, lp, imp, li)
			case li == lp && !slices.Contains(allowed[pkg], imp):
				t.Errorf("%s imports %s, of its own layer, which allowed does not list", pkg, imp)
			}
		}
	}
}

var declared = regexp.MustCompile(`(?s)// Tokenbus imports: (.*?)\.\n(?://\n)*package `)

// Every package says in its doc.go which tokenbus packages it imports, and
// says it truly.
func TestDocsSayWhatPackagesImport(t *testing.T) {
	root := filepath.Join("..", "..")
	for pkg, imps := range packages(t) {
		b, err := os.ReadFile(filepath.Join(root, pkg, "doc.go"))
		if err != nil {
			if pkg != "integration" {
				t.Errorf("%s has no doc.go saying what it is and what it imports", pkg)
			}
			continue
		}
		m := declared.FindSubmatch(b)
		if m == nil {
			t.Errorf("%s/doc.go does not end with \"Tokenbus imports: ...\" before its package clause", pkg)
			continue
		}
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(m[1]), "//", "")), " ")
		var said []string
		if text != "none" {
			for _, p := range strings.Split(text, ",") {
				said = append(said, strings.TrimSpace(p))
			}
		}
		slices.Sort(said)
		if !slices.Equal(said, imps) {
			t.Errorf("%s/doc.go says it imports %v; it imports %v", pkg, said, imps)
		}
	}
}

// The folders carry the layers: drawn as one box per top-level folder (cmd,
// program, gateway, internal, schemas, ...) with an arrow wherever a package
// of one imports a package of another, no arrow runs up, that is, the
// folders' imports have no cycle. (internal/ holds only helpers below the
// roles and test support; the programs live in program/.)
func TestFoldersShowTheLayers(t *testing.T) {
	top := func(pkg string) string { f, _, _ := strings.Cut(pkg, "/"); return f }
	edges := map[string][]string{}
	for pkg, imps := range packages(t) {
		if slices.Contains(testOnly, pkg) {
			continue
		}
		for _, imp := range imps {
			if a, b := top(pkg), top(imp); a != b && !slices.Contains(edges[a], b) {
				edges[a] = append(edges[a], b)
			}
		}
	}
	// Depth-first search for a cycle, reported with its path.
	const (
		unseen = iota
		open
		closed
	)
	state := map[string]int{}
	var path []string
	var visit func(f string) bool
	visit = func(f string) bool {
		switch state[f] {
		case open:
			t.Errorf("folders import each other in a circle, so an arrow runs up: %s → %s", strings.Join(path, " → "), f)
			return true
		case closed:
			return false
		}
		state[f] = open
		path = append(path, f)
		for _, g := range edges[f] {
			if visit(g) {
				return true
			}
		}
		path = path[:len(path)-1]
		state[f] = closed
		return false
	}
	for f := range edges {
		if visit(f) {
			return
		}
	}
}
