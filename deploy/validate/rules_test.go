package validate

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The rules: deploy/prometheus/tokenbus.rules.yml, their promtool unit tests
// beside them, and the Helm chart's copy (a chart reads only its own files).
const (
	rulesFile      = "deploy/prometheus/tokenbus.rules.yml"
	rulesTestFile  = "deploy/prometheus/tokenbus.rules.test.yml"
	chartRulesFile = "deploy/helm/tokenbus/files/tokenbus.rules.yml"
	runbookURL     = "https://github.com/tokenbus/tokenbus/blob/main/docs/operations.md#"
)

// What issue 21 asks the rules for, at the least.
var (
	mustRecord = []string{
		"model:tokenbus_gateway_requests:rate5m",
		"model:tokenbus_gateway_error_ratio:rate5m",
		"model:tokenbus_gateway_time_to_first_token_seconds:p50_5m",
		"model:tokenbus_gateway_time_to_first_token_seconds:p99_5m",
		"model:tokenbus_gateway_inter_token_latency_seconds:p50_5m",
		"model:tokenbus_gateway_inter_token_latency_seconds:p99_5m",
		"model:tokenbus_dispatcher_queue_depth:sum",
		"model:tokenbus_gateway_output_tokens:rate1m",
	}
	mustAlert = []string{
		"TokenbusModelHasNoWorker", "TokenbusErrorRatioHigh", "TokenbusTimeToFirstTokenHigh", "TokenbusQueueGrowing",
		"TokenbusWorkerFlapping", "TokenbusNATSDisconnected", "TokenbusRedisUnreachable", "TokenbusUsageRecordsBuffered",
	}
)

// parseRules parses a rule file as Prometheus does (rulefmt: expressions,
// templates, names, duplicates).
func parseRules(t *testing.T, where string, content []byte) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, promParser, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", where, err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatalf("%s: no rule groups", where)
	}
	return groups
}

var (
	recordedOnce sync.Once
	recorded     map[string]bool
)

// isRecorded reports whether name is a series the rules record: queries may
// read those too.
func isRecorded(name string) bool {
	recordedOnce.Do(func() {
		recorded = map[string]bool{}
		_, here, _, _ := runtime.Caller(0)
		b, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", rulesFile))
		if err != nil {
			return // then no query may read a recorded series: TestPrometheusRules fails on its own
		}
		for _, m := range regexp.MustCompile(`(?m)^\s*- record: (\S+)`).FindAllSubmatch(b, -1) {
			recorded[string(m[1])] = true
		}
	})
	return recorded[name]
}

// TestPrometheusRules: the rules parse as Prometheus parses them, read only
// exported series and labels, include what the issue asks for, and every
// alert has a severity, a summary, a description and a runbook entry in
// docs/operations.md; the chart's copy is the same file, and compose mounts
// it where prometheus.yml looks.
func TestPrometheusRules(t *testing.T) {
	groups := parseRules(t, rulesFile, readFile(t, rulesFile))
	runbook := string(readFile(t, "docs", "operations.md"))
	entries := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^### (Tokenbus\w+)\s*$`).FindAllStringSubmatch(runbook, -1) {
		entries[m[1]] = true
	}
	var records, alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			where := rulesFile + ": " + r.Record + r.Alert
			checkPromQL(t, where, r.Expr)
			if r.Record != "" {
				records = append(records, r.Record)
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", where, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", where)
			}
			if got, want := r.Annotations["runbook_url"], runbookURL+strings.ToLower(r.Alert); got != want {
				t.Errorf("%s: runbook_url %q, want %q", where, got, want)
			}
			if !entries[r.Alert] {
				t.Errorf("%s: docs/operations.md has no runbook entry \"### %s\"", where, r.Alert)
			}
		}
	}
	for e := range entries {
		if !slices.Contains(alerts, e) {
			t.Errorf("docs/operations.md has a runbook entry for %s, which no rule raises", e)
		}
	}
	for _, r := range mustRecord {
		if !slices.Contains(records, r) {
			t.Errorf("no recording rule %s", r)
		}
	}
	for _, a := range mustAlert {
		if !slices.Contains(alerts, a) {
			t.Errorf("no alert %s", a)
		}
	}
	if !bytes.Equal(readFile(t, rulesFile), readFile(t, chartRulesFile)) {
		t.Errorf("%s differs from %s: cp %[2]s %[1]s", chartRulesFile, rulesFile)
	}

	// Compose: prometheus.yml names the file, mounted beside it.
	var cfg promConfig
	if err := yaml.UnmarshalStrict(readFile(t, "deploy/prometheus/prometheus.yml"), &cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.RuleFiles, "tokenbus.rules.yml") {
		t.Errorf("prometheus.yml rule_files %v: want tokenbus.rules.yml", cfg.RuleFiles)
	}
	mounted := map[string]string{}
	for _, v := range loadCompose(t, "observability").Services["prometheus"].Volumes {
		mounted[v.Target] = v.Source
	}
	for _, f := range cfg.RuleFiles {
		src, ok := mounted["/etc/prometheus/"+f]
		if !ok || !strings.HasSuffix(src, "deploy/prometheus/"+f) {
			t.Errorf("rule file %s is not mounted beside prometheus.yml (mounts: %v)", f, mounted)
		}
	}
}

// promtool is the path of Debian's (or any) promtool; run.sh installs it and
// then requires it (TOKENBUS_VALIDATE_REQUIRE_PROMETHEUS).
func promtool(t *testing.T) string {
	t.Helper()
	return needBinary(t, "promtool")
}

// needBinary finds a Prometheus binary on PATH: a skip, or under run.sh a
// failure, when it is missing.
func needBinary(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("TOKENBUS_VALIDATE_REQUIRE_PROMETHEUS") != "" {
			t.Fatalf("%s not found on PATH (run.sh installs Debian's prometheus package)", name)
		}
		t.Skipf("%s not found on PATH: run deploy/validate/run.sh, which installs it", name)
	}
	return p
}

// TestPromtool: promtool checks the config and both copies of the rules, and
// runs the rules' unit tests.
func TestPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "config", "deploy/prometheus/prometheus.yml"},
		{"check", "rules", rulesFile, chartRulesFile},
		{"test", "rules", rulesTestFile},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = repoRoot(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// prometheusRule mirrors the fields of prometheus-operator's PrometheusRule
// the chart uses; the groups are checked as a rule file.
type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []json.RawMessage `json:"groups"`
	} `json:"spec"`
}

// checkPrometheusRule: the chart's PrometheusRule holds the rules of
// deploy/prometheus/tokenbus.rules.yml, as Prometheus reads them.
func checkPrometheusRule(t *testing.T, m manifest) {
	var pr prometheusRule
	strictJSON(t, &m, &pr)
	groups, err := json.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	got := parseRules(t, m.String(), groups) // YAML is a superset of JSON
	want := parseRules(t, rulesFile, readFile(t, rulesFile))
	if !reflect.DeepEqual(got.Groups, want.Groups) {
		t.Errorf("%s: its rule groups differ from %s", m, rulesFile)
	}
}
