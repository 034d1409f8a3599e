package validate

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // inside collapsed rows
}

type grafanaDashboard struct {
	UID           string         `json:"uid"`
	Title         string         `json:"title"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// The series the brief asks the dashboard to show, at the least.
var dashboardMustShow = []string{
	"tokenbus_gateway_requests_total",
	"tokenbus_gateway_time_to_first_token_seconds_bucket",
	"tokenbus_gateway_inter_token_latency_seconds_bucket",
	"tokenbus_gateway_active_streams",
	"tokenbus_dispatcher_queue_depth",
	"tokenbus_dispatcher_queue_wait_seconds_bucket",
	"tokenbus_dispatcher_rejected_total",
	"tokenbus_dispatcher_routed_total",
	"tokenbus_worker_running",
	"tokenbus_worker_waiting",
	"tokenbus_gateway_stream_errors_total",
	"tokenbus_gateway_tokens_total",
	"tokenbus_dispatcher_workers",
	"tokenbus_dispatcher_running",
}

// Grafana's macros, replaced by values before Prometheus sees a query.
var grafanaMacros = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h",
	"$model", "llama-8b", "${model}", "llama-8b")

func TestGrafanaDashboard(t *testing.T) {
	var d grafanaDashboard
	if err := json.Unmarshal(readFile(t, "deploy/grafana/dashboards/tokenbus.json"), &d); err != nil {
		t.Fatalf("tokenbus.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
		t.Error("dashboard without uid, title or schemaVersion")
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		// label_values(metric, label)
		m := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`).FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q: want label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		if !knownMetrics[m[1]] || (knownLabels[m[1]] != nil && !contains(knownLabels[m[1]], m[2])) {
			t.Errorf("variable %s: %s has no label %s", v.Name, m[1], m[2])
		}
	}
	if !vars["datasource"] {
		t.Error("no datasource variable")
	}
	var panels []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			panels = append(panels, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	ids := map[int]bool{}
	shown := map[string]bool{}
	for _, p := range panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource must be prometheus", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no queries", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if refs[tg.RefID] {
				t.Errorf("panel %q: refId %s twice", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			q := grafanaMacros.Replace(tg.Expr)
			if strings.Contains(q, "$") {
				t.Errorf("panel %q: %q uses an unknown variable", p.Title, tg.Expr)
			}
			for metric := range checkPromQL(t, "panel "+p.Title, q) {
				shown[metric] = true
			}
			// A legend's {{label}} must survive the query's aggregation.
			expr, err := promParser.ParseExpr(q)
			if err != nil {
				continue
			}
			kept := outputLabels(expr)
			for _, lm := range regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`).FindAllStringSubmatch(tg.LegendFormat, -1) {
				if kept != nil && !kept[lm[1]] {
					t.Errorf("panel %q: legend {{%s}} but %q keeps only %v", p.Title, lm[1], tg.Expr, kept)
				}
			}
		}
	}
	for _, m := range dashboardMustShow {
		if !shown[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// outputLabels are the labels an expression's result keeps when its outermost
// aggregation is `by (...)` (histogram_quantile drops le); nil when unknown.
func outputLabels(e parser.Expr) map[string]bool {
	switch e := e.(type) {
	case *parser.AggregateExpr:
		if e.Without {
			return nil
		}
		out := map[string]bool{}
		for _, g := range e.Grouping {
			out[g] = true
		}
		return out
	case *parser.Call:
		for _, a := range e.Args {
			if l := outputLabels(a); l != nil {
				if e.Func.Name == "histogram_quantile" {
					delete(l, "le")
				}
				return l
			}
		}
	case *parser.ParenExpr:
		return outputLabels(e.Expr)
	case *parser.BinaryExpr:
		l := outputLabels(e.LHS)
		r := outputLabels(e.RHS)
		if l != nil && r != nil && len(r) < len(l) {
			return r
		}
		return l
	}
	return nil
}

// TestGrafanaProvisioning: the datasource and dashboard provider Grafana
// loads in compose point at the right things.
func TestGrafanaProvisioning(t *testing.T) {
	var ds struct {
		APIVersion  int `json:"apiVersion"`
		Datasources []struct {
			Name, UID, Type, Access, URL string
			IsDefault                    bool           `json:"isDefault"`
			JSONData                     map[string]any `json:"jsonData"`
		} `json:"datasources"`
	}
	if err := yaml.UnmarshalStrict(readFile(t, "deploy/grafana/provisioning/datasources/prometheus.yml"), &ds); err != nil {
		t.Fatal(err)
	}
	p := loadCompose(t, "observability")
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("datasources %+v: want one prometheus at http://prometheus:9090", ds.Datasources)
	}
	if _, ok := p.Services["prometheus"]; !ok {
		t.Error("no prometheus service in the observability profile")
	}
	var prov struct {
		APIVersion int `json:"apiVersion"`
		Providers  []struct {
			Name, Folder, Type    string
			DisableDeletion       bool `json:"disableDeletion"`
			AllowUIUpdates        bool `json:"allowUiUpdates"`
			UpdateIntervalSeconds int  `json:"updateIntervalSeconds"`
			Options               struct {
				Path                      string `json:"path"`
				FoldersFromFilesStructure bool   `json:"foldersFromFilesStructure"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.UnmarshalStrict(readFile(t, "deploy/grafana/provisioning/dashboards/tokenbus.yml"), &prov); err != nil {
		t.Fatal(err)
	}
	g := p.Services["grafana"]
	var targets []string
	for _, v := range g.Volumes {
		targets = append(targets, v.Target)
		if strings.HasSuffix(v.Source, "deploy/grafana/provisioning") && v.Target != "/etc/grafana/provisioning" {
			t.Errorf("provisioning mounted at %s", v.Target)
		}
	}
	for _, pr := range prov.Providers {
		if !slices.Contains(targets, pr.Options.Path) {
			t.Errorf("dashboard provider reads %s, where grafana mounts nothing (mounts: %v)", pr.Options.Path, targets)
		}
	}
}
