package schemas

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/errors.md from the catalogue")

// errorsDoc renders docs/errors.md from the catalogue.
func errorsDoc() []byte {
	var b bytes.Buffer
	b.WriteString(`# Errors

Every error tokenbus answers with, generated from the catalogue in [` + "`schemas/catalog.go`" + `](../schemas/catalog.go)
(` + "`go test ./schemas -run TestErrorDocs -update`" + ` rewrites this page; a test fails when it is out of date). Each is OpenAI's
nested error object, ` + "`" + `{"error":{"message","type","param","code"}}` + "`" + `, with the HTTP status; on the bus the same object
travels in an error frame with its status and retry hint (see [protocol](protocol.md#the-reply-stream)). After a
stream's first token the status is already 200: the error comes as ` + "`data: {\"error\":{...}}`" + ` and ` + "`data: [DONE]`" + `.

Clients can act on the code: 503s with a Retry-After (` + "`queue_full`, `no_worker`, `no_dispatcher`, `stream_lost`, `worker_busy`, `shutting_down`, `engine_unhealthy`" + `)
are worth retrying, another replica or worker may take the request; 4xx are not, the request itself must change.
A message with ` + "`%s`" + ` or ` + "`%d`" + ` has the request's particulars there.
`)
	for _, sec := range Sections {
		fmt.Fprintf(&b, "\n## %s\n\n| code | status | type | retry | param | message | when |\n|---|---|---|---|---|---|---|\n", sec)
		for _, d := range Catalogue {
			if d.Section != sec {
				continue
			}
			code := "`" + d.Code + "`"
			if d.Code == "" {
				code = "null"
			}
			status, typ := fmt.Sprint(d.Status), "`"+d.Type+"`"
			if d == ErrUpstream {
				code, status, typ = "the engine's", "the engine's", "the engine's"
			}
			retry := ""
			if d.RetryAfter > 0 {
				retry = fmt.Sprintf("%d s", d.RetryAfter)
			}
			param := ""
			if d.Param != "" {
				param = "`" + d.Param + "`"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", code, status, typ, retry, param,
				cell(d.Message), cell(d.When))
		}
	}
	return b.Bytes()
}

// cell escapes a table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// docs/errors.md is the catalogue, rendered.
func TestErrorDocs(t *testing.T) {
	path := filepath.Join("..", "docs", "errors.md")
	want := errorsDoc()
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s is not the catalogue's rendering (%v): run go test ./schemas -run TestErrorDocs -update", path, err)
	}
}

// Every definition is complete and says what a client gets.
func TestCatalogueEntries(t *testing.T) {
	known := map[string]bool{TypeInvalidRequest: true, TypeAuthentication: true, TypePermission: true, TypeNotFound: true,
		TypeRateLimit: true, TypeOverloaded: true, TypeServer: true, TypeTimeout: true}
	sections := map[string]bool{}
	for _, s := range Sections {
		sections[s] = true
	}
	for _, d := range Catalogue {
		name := d.Code + ": " + d.Message
		if d == ErrUpstream {
			continue
		}
		switch {
		case d.Message == "" || d.When == "":
			t.Errorf("%s: no message or no when", name)
		case !known[d.Type]:
			t.Errorf("%s: type %q is not OpenAI's", name, d.Type)
		case d.Status != 499 && http.StatusText(d.Status) == "":
			t.Errorf("%s: status %d", name, d.Status)
		case !sections[d.Section]:
			t.Errorf("%s: section %q is not listed", name, d.Section)
		case d.RetryAfter > 0 && d.Status != http.StatusServiceUnavailable && d.Status != http.StatusTooManyRequests:
			t.Errorf("%s: a retry hint on a %d", name, d.Status)
		case d.Status == http.StatusServiceUnavailable && d.RetryAfter == 0:
			t.Errorf("%s: a 503 without a retry hint", name)
		}
		e := d.New()
		if !d.Is(e) || e.Body.Type != d.Type || e.RetryAfter != d.RetryAfter {
			t.Errorf("%s: New makes %+v", name, e)
		}
	}
}

// Errors are made from the catalogue only: no other package builds an
// *Error itself (FromUpstream, for what an engine answered, aside).
func TestNoErrorsOutsideTheCatalogue(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".cache", "node_modules", "deploy", "schemas":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Error" {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "schemas" {
					t.Errorf("%s: builds a schemas.Error itself; use a definition of schemas/catalog.go", fset.Position(lit.Pos()))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
