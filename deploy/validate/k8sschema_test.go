package validate

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"
)

// The Kubernetes JSON schemas come from the PyPI package kubernetes-validate
// (its wheel bundles them, one directory per Kubernetes version, with
// "-local-strict" variants that refuse unknown fields). run.sh downloads the
// wheel with pip and points TOKENBUS_K8S_SCHEMAS at it (the .whl file itself,
// read as a zip, or a directory it was unpacked into). kubeconform could not
// be used as is: it fetches schemas from GitHub, and its local-path mode cannot
// resolve these files' "/api/_definitions.json" references. It validates with
// the same library used here (santhosh-tekuri/jsonschema).
const schemaEnv = "TOKENBUS_K8S_SCHEMAS"

type k8sSchemaSet struct {
	fsys fs.FS  // the wheel or a directory
	root string // path of kubernetes-json-schema inside fsys
	mu   sync.Mutex
	comp map[string]*jsonschema.Compiler // per Kubernetes version
	sch  map[string]*jsonschema.Schema   // per version + file
}

func k8sSchemas(t *testing.T) *k8sSchemaSet {
	t.Helper()
	p := os.Getenv(schemaEnv)
	if p == "" {
		if os.Getenv("TOKENBUS_VALIDATE_REQUIRE_SCHEMAS") != "" {
			t.Fatalf("%s is not set (run deploy/validate/run.sh, which downloads the schemas)", schemaEnv)
		}
		t.Logf("%s not set: manifests are checked by strict decoding into the Kubernetes API types only, not against the JSON schemas (run.sh sets it)", schemaEnv)
		return nil
	}
	var fsys fs.FS
	if strings.HasSuffix(p, ".whl") || strings.HasSuffix(p, ".zip") {
		zr, err := zip.OpenReader(p)
		if err != nil {
			t.Fatalf("%s: %v", schemaEnv, err)
		}
		t.Cleanup(func() { zr.Close() })
		fsys = zr
	} else {
		fsys = os.DirFS(p)
	}
	root := ""
	for _, cand := range []string{"kubernetes_validate/kubernetes-json-schema", "kubernetes-json-schema", "."} {
		if _, err := fs.Stat(fsys, path.Join(cand, "v1.30.0-local-strict", "_definitions.json")); err == nil {
			root = cand
			break
		}
	}
	if root == "" {
		t.Fatalf("%s=%s holds no kubernetes-json-schema/<version>-local-strict directories", schemaEnv, p)
	}
	return &k8sSchemaSet{fsys: fsys, root: root, comp: map[string]*jsonschema.Compiler{}, sch: map[string]*jsonschema.Schema{}}
}

// schemaFile is kubernetes-validate's file name for a kind: deployment-apps-v1.json, service-v1.json.
func schemaFile(apiVersion, kind string) string {
	group, version, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return fmt.Sprintf("%s-%s.json", strings.ToLower(kind), apiVersion)
	}
	group, _, _ = strings.Cut(group, ".")
	return fmt.Sprintf("%s-%s-%s.json", strings.ToLower(kind), group, version)
}

func (s *k8sSchemaSet) schema(kubeVersion, apiVersion, kind string) (*jsonschema.Schema, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := path.Join(s.root, kubeVersion+"-local-strict")
	file := schemaFile(apiVersion, kind)
	key := kubeVersion + "/" + file
	if sch, ok := s.sch[key]; ok {
		return sch, nil
	}
	load := func(name string) (any, error) {
		b, err := fs.ReadFile(s.fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		return jsonschema.UnmarshalJSON(bytes.NewReader(b))
	}
	c := s.comp[kubeVersion]
	if c == nil {
		c = jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		defs, err := load("_definitions.json")
		if err != nil {
			return nil, fmt.Errorf("schemas for Kubernetes %s: %w", kubeVersion, err)
		}
		// The kind files refer to "/api/_definitions.json#/$defs/..." under
		// their own $id, https://kubernetes.io/api/<kind>/<group>/<version>.
		if err := c.AddResource("https://kubernetes.io/api/_definitions.json", defs); err != nil {
			return nil, err
		}
		s.comp[kubeVersion] = c
	}
	doc, err := load(file)
	if err != nil {
		return nil, fmt.Errorf("no schema %s for Kubernetes %s: %w", file, kubeVersion, err)
	}
	loc := "https://kubernetes.io/tokenbus-validate/" + kubeVersion + "/" + file
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, err
	}
	s.sch[key] = sch
	return sch, nil
}

// validate checks a built-in kind against the strict schema of kubeVersion.
func (s *k8sSchemaSet) validate(t *testing.T, kubeVersion string, m manifest) {
	t.Helper()
	if m.obj == nil { // custom resources: checked by their own mirrors
		return
	}
	if err := s.validateErr(kubeVersion, m); err != nil {
		t.Errorf("%s against the Kubernetes %s schema: %v", m, kubeVersion, err)
	}
}

func (s *k8sSchemaSet) validateErr(kubeVersion string, m manifest) error {
	sch, err := s.schema(kubeVersion, m.apiVersion, m.kind)
	if err != nil {
		return err
	}
	j, err := yaml.YAMLToJSON(m.raw)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}
