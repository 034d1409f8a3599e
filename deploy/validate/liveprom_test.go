package validate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"sigs.k8s.io/yaml"
)

// The live test runs tokenbus as it is deployed, one role per process (a
// `tokenbus dev`, whose gateway /metrics carries its dispatcher and worker,
// beside a standalone dispatcher and worker on dev's NATS and store), built
// from this checkout, and a real Prometheus scraping all three every second
// with deploy/prometheus/tokenbus.rules.yml loaded. Processes rather than the
// product's Go API: this module keeps the product out of its module graph,
// and the binary, its flags and its listeners are what a deployment runs.
// Every port is chosen at run time; every process ends with the test.

const (
	liveModel    = "llama-8b"
	liveInterval = time.Second // scrape and rule evaluation interval
)

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a child process, signalled (SIGTERM, then killed after 10s) and
// waited for when the test ends.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	exited         chan struct{}
	err            error
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.WaitDelay = 10 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("%s did not stop within 10s of SIGTERM", name)
		}
	})
	return p
}

// errExited is poll's answer when the process ended first.
var errExited = fmt.Errorf("the process exited")

// poll calls cond until it holds (nil), the process exits (errExited) or
// timeout passes (cond's last error).
func (p *proc) poll(timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s (last: %v)", timeout, last)
		}
		select {
		case <-p.exited:
			return errExited
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitFor polls cond until it holds; the test fails if the process dies or
// 60s pass first.
func (p *proc) waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	if err := p.poll(60*time.Second, cond); err != nil {
		t.Fatalf("%s: no %s: %v (exit: %v)\nstdout:\n%s\nstderr:\n%s", p.name, what, err, p.err, p.stdout.String(), p.stderr.String())
	}
}

// logValue waits for the JSON log line with msg and returns its key.
func (p *proc) logValue(t *testing.T, msg, key string) string {
	t.Helper()
	var v string
	p.waitFor(t, fmt.Sprintf("log line %q", msg), func() (bool, error) {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
				v, _ = rec[key].(string)
				return v != "", nil
			}
		}
		return false, nil
	})
	return v
}

// tokenbusBinary builds cmd/tokenbus of this checkout, or takes
// TOKENBUS_VALIDATE_TOKENBUS_BIN (a binary built elsewhere).
func tokenbusBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("TOKENBUS_VALIDATE_TOKENBUS_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "tokenbus")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/tokenbus")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/tokenbus: %v\n%s", err, out)
	}
	return bin
}

// freePort is a port free on 127.0.0.1 now, for a program that cannot listen
// on port 0 and say where (Prometheus logs the address it was given).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// promAPI is a Prometheus server's HTTP API.
type promAPI struct{ base string }

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

func (a promAPI) get(path string, params url.Values, into any) error {
	resp, err := http.Get(a.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, params, env.Error)
	}
	return json.Unmarshal(env.Data, into)
}

// query runs an instant query; the result must be a vector.
func (a promAPI) query(q string) ([]promSample, error) {
	var d struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	if err := a.get("/api/v1/query", url.Values{"query": {q}}, &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, fmt.Errorf("%q: a %s, want a vector", q, d.ResultType)
	}
	return d.Result, nil
}

// number is the one value of q now; an error if there is none or it is not a
// number.
func (a promAPI) number(q string) (float64, error) {
	res, err := a.query(q)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("%q: %d series, want 1: %v", q, len(res), res)
	}
	v, err := sampleValue(res[0].Value)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q: value %v (%v)", q, res[0].Value, err)
	}
	return v, nil
}

func sampleValue(p [2]any) (float64, error) {
	s, _ := p[1].(string)
	return strconv.ParseFloat(s, 64)
}

// coverage runs q over [from, to] at the scrape interval and returns how many
// steps have a numeric value (over all series: one per step for a query that
// sums to one series), how many steps there are, and the largest value.
func (a promAPI) coverage(q string, from, to time.Time) (with, steps int, maxV float64, err error) {
	var d struct {
		Result []promSample `json:"result"`
	}
	params := url.Values{"query": {q}, "start": {unix(from)}, "end": {unix(to)}, "step": {liveInterval.String()}}
	if err := a.get("/api/v1/query_range", params, &d); err != nil {
		return 0, 0, 0, err
	}
	steps = int(to.Sub(from)/liveInterval) + 1
	maxV = math.Inf(-1)
	for _, s := range d.Result {
		for _, p := range s.Values {
			v, err := sampleValue(p)
			if err == nil && !math.IsNaN(v) {
				with++
				maxV = math.Max(maxV, v)
			}
		}
	}
	return with, steps, maxV, nil
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64) }

// autoscalingQueries are the queries docs/deploy.md gives for autoscaling
// (its "Autoscaling signals" section: the promql block, prometheus-adapter's
// metricsQuery for the HPA, whose selector it fills as the adapter does),
// and the chart's ScaledObject queries for pools of liveModel.
func autoscalingQueries(t *testing.T) []string {
	t.Helper()
	doc := string(readFile(t, "docs", "deploy.md"))
	start := strings.Index(doc, "### Autoscaling signals")
	if start < 0 {
		t.Fatal(`docs/deploy.md has no "### Autoscaling signals" section`)
	}
	section := doc[start:]
	if loc := regexp.MustCompile(`\n##+ `).FindStringIndex(section[4:]); loc != nil { // the next heading
		section = section[:loc[0]+4]
	}
	var queries []string
	var sawAdapter, sawHPA bool
	for _, m := range regexp.MustCompile("(?s)```(\\w+)\n(.*?)```").FindAllStringSubmatch(section, -1) {
		switch m[1] {
		case "promql":
			for _, line := range strings.Split(m[2], "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					queries = append(queries, line)
				}
			}
		case "yaml":
			var head struct {
				Kind          string `json:"kind"`
				ExternalRules []struct {
					SeriesQuery  string `json:"seriesQuery"`
					MetricsQuery string `json:"metricsQuery"`
				} `json:"externalRules"`
			}
			if err := yaml.Unmarshal([]byte(m[2]), &head); err != nil {
				t.Fatalf("docs/deploy.md: a yaml block that does not parse: %v\n%s", err, m[2])
			}
			for _, r := range head.ExternalRules {
				sawAdapter = true
				checkPromQL(t, "docs/deploy.md prometheus-adapter seriesQuery", r.SeriesQuery)
				queries = append(queries, strings.ReplaceAll(r.MetricsQuery, "<<.LabelMatchers>>", `model="`+liveModel+`"`))
			}
			if head.Kind == "HorizontalPodAutoscaler" {
				sawHPA = true
				obj, _, err := strictCodecs.UniversalDeserializer().Decode([]byte(m[2]), nil, nil)
				hpa, ok := obj.(*autoscalingv2.HorizontalPodAutoscaler)
				if err != nil || !ok {
					t.Fatalf("docs/deploy.md: the HPA example does not decode strictly as autoscaling/v2: %v", err)
				}
				if len(hpa.Spec.Metrics) != 1 || hpa.Spec.Metrics[0].External == nil ||
					hpa.Spec.Metrics[0].External.Metric.Selector.MatchLabels["model"] != liveModel ||
					hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 1 {
					t.Fatalf("docs/deploy.md: the HPA example: want one external metric for model %s and minReplicas >= 1: %+v", liveModel, hpa.Spec)
				}
			}
		}
	}
	if len(queries) < 2 || !sawAdapter || !sawHPA {
		t.Fatalf("docs/deploy.md: autoscaling section with %d queries, prometheus-adapter rule %v, HPA %v", len(queries), sawAdapter, sawHPA)
	}
	ch := loadChart(t)
	ms, err := renderChart(t, ch, kubeVersions[1], variantValues(t, "keda"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.kind != "ScaledObject" {
			continue
		}
		var so scaledObject
		strictJSON(t, &m, &so)
		for _, tr := range so.Spec.Triggers {
			if q := tr.Metadata["query"]; strings.Contains(q, `model="`+liveModel+`"`) && !slices.Contains(queries, q) {
				queries = append(queries, q)
			}
		}
	}
	for _, q := range queries {
		checkPromQL(t, "docs/deploy.md", q)
	}
	return queries
}

// TestLivePrometheus: against a real Prometheus scraping a running tokenbus,
// every autoscaling query of docs/deploy.md (and the chart's) returns a
// number at every scrape, idle and under load (an empty answer is a
// failure: an autoscaler would read null), every rule evaluates, every
// recording rule has a value once requests have run, and no alert fires.
func TestLivePrometheus(t *testing.T) {
	promBin := needBinary(t, "prometheus")
	queries := autoscalingQueries(t)
	bin := tokenbusBinary(t)

	// tokenbus: dev (gateway, dispatcher, one worker), a dispatcher and a
	// worker. Two slots per worker, so a little load queues.
	slow := []string{"--max-concurrency", "2", "--sim-decode-base", "20ms", "--log-format", "json"}
	const adminToken = "live-prometheus-admin-token"
	dev := startProc(t, "tokenbus dev", bin, append([]string{"dev", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--admin-token", adminToken,
		"--nats-listen", "127.0.0.1:-1", "--data-dir", "temp", "--sim-workers", "1"}, slow...)...)
	var api, natsURL, storeURL, adminAddr string
	dev.waitFor(t, "banner", func() (bool, error) {
		out := dev.stdout.String()
		find := func(re string) string {
			if m := regexp.MustCompile(re).FindStringSubmatch(out); m != nil {
				return m[1]
			}
			return ""
		}
		api, natsURL, storeURL = find(`OpenAI API\s+http://(\S+)/v1`), find(`NATS\s+(nats://\S+)`), find(`store\s+(redis://\S+)`)
		adminAddr = find(`admin API\s+http://(\S+)`)
		return strings.Contains(out, "Ctrl-C") && api != "" && natsURL != "" && storeURL != "" && adminAddr != "", nil
	})
	disp := startProc(t, "tokenbus dispatcher", bin, "dispatcher", "--nats-url", natsURL, "--redis-url", storeURL,
		"--metrics", "127.0.0.1:0", "--log-format", "json")
	dispMetrics := disp.logValue(t, "metrics listening", "metrics")
	worker := startProc(t, "tokenbus worker", bin, append([]string{"worker", "--nats-url", natsURL, "--redis-url", storeURL,
		"--metrics", "127.0.0.1:0", "--id", "live-worker"}, slow...)...)
	workerMetrics := worker.logValue(t, "metrics listening", "metrics")

	// Prometheus, its own storage, the rules of this checkout.
	dir := t.TempDir()
	target := func(u string) string { pu, _ := url.Parse(u); return pu.Host }
	cfg := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: [%[2]q]
scrape_configs:
  - job_name: tokenbus-gateway
    static_configs: [{targets: [%[3]q]}]
  - job_name: tokenbus-dispatcher
    static_configs: [{targets: [%[4]q]}]
  - job_name: tokenbus-worker
    static_configs: [{targets: [%[5]q]}]
`, liveInterval, repoPath(t, rulesFile), api, target(dispMetrics), target(workerMetrics))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var prom promAPI
	for attempt := 0; ; attempt++ {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		p := startProc(t, "prometheus", promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data-%d", attempt)), "--web.listen-address="+addr, "--log.level=warn")
		prom = promAPI{"http://" + addr}
		err := p.poll(60*time.Second, func() (bool, error) {
			resp, err := http.Get(prom.base + "/-/ready")
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == 200, fmt.Errorf("/-/ready: %d", resp.StatusCode)
		})
		if err == nil {
			break
		}
		// The port was taken between freePort and the bind: try another.
		if attempt == 2 || !strings.Contains(p.stderr.String(), "address already in use") {
			t.Fatalf("prometheus did not become ready: %v\n%s", err, p.stderr.String())
		}
	}

	// scrapes is how many times Prometheus has scraped the dispatcher since from.
	scrapes := func(from time.Time) (float64, error) {
		return prom.number(fmt.Sprintf(`count_over_time(up{job="tokenbus-dispatcher"}[%dms])`, time.Since(from).Milliseconds()))
	}
	waitScrapes := func(what string, from time.Time, n float64) {
		t.Helper()
		dev.waitFor(t, what, func() (bool, error) {
			got, err := scrapes(from)
			return err == nil && got >= n, err
		})
	}
	dev.waitFor(t, "every target up", func() (bool, error) {
		n, err := prom.number(`sum(up{job=~"tokenbus-.*"})`)
		return err == nil && n == 3, err
	})

	// Prometheus has scraped every target and evaluated the rules once
	// every query answers; from then on it must answer at every step.
	dev.waitFor(t, "an answer to every autoscaling query", func() (bool, error) {
		for _, q := range queries {
			if _, err := prom.number(q); err != nil {
				return false, err
			}
		}
		return true, nil
	})

	// Idle: no request yet.
	idleFrom := time.Now()
	waitScrapes("idle scrapes", idleFrom, 6)
	idleTo := time.Now()
	for _, q := range queries {
		if v, err := prom.number(q); err != nil || v != 0 {
			t.Errorf("idle: %q: %v, %v; want 0", q, v, err)
		}
	}

	// Busy: more streams than the workers take at once, for a while.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var requests, failed sync.Map
	body := `{"model":"` + liveModel + `","stream":true,"max_tokens":24,"messages":[{"role":"user","content":"Tell me a story"}]}`
	for c := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post("http://"+api+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != 200 {
					failed.Store(fmt.Sprint(c, n), fmt.Sprint(err, resp))
				}
				requests.Store(fmt.Sprint(c, n), true)
			}
		}()
	}
	busyFrom := time.Now()
	dev.waitFor(t, "a queue under load", func() (bool, error) {
		v, err := prom.number(`sum(tokenbus_dispatcher_queue_depth{model="` + liveModel + `"})`)
		return err == nil && v > 0, err
	})
	waitScrapes("busy scrapes", busyFrom, 8)
	busyTo := time.Now()
	close(stop)
	wg.Wait()
	nreq, nfail := 0, 0
	requests.Range(func(any, any) bool { nreq++; return true })
	failed.Range(func(k, v any) bool { nfail++; t.Errorf("request %v: %v", k, v); return nfail < 5 })

	// Every query had a number at every step, idle and busy.
	for _, q := range queries {
		for _, w := range []struct {
			name     string
			from, to time.Time
		}{{"idle", idleFrom, idleTo}, {"busy", busyFrom, busyTo}} {
			with, steps, maxV, err := prom.coverage(q, w.from.Add(liveInterval), w.to)
			if err != nil {
				t.Errorf("%s: %q: %v", w.name, q, err)
				continue
			}
			t.Logf("%s: %q: a value at %d of %d steps (one a scrape), max %g", w.name, q, with, steps, maxV)
			if with != steps {
				t.Errorf("%s: %q has a value at %d of %d steps: an autoscaler would read nothing at the others", w.name, q, with, steps)
			}
			if w.name == "busy" && !(maxV > 0) {
				t.Errorf("busy: %q never rose above 0 (max %g)", q, maxV)
			}
		}
	}
	t.Logf("%d requests under load, %d failed", nreq, nfail)

	// Rules: all evaluate; the recording rules have values now; no alert fires.
	waitScrapes("rule evaluations after the load", busyTo, 3)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Type      string `json:"type"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
				State     string `json:"state"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := prom.get("/api/v1/rules", nil, &rules); err != nil {
		t.Fatal(err)
	}
	nrules := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			nrules++
			if r.Health != "ok" {
				t.Errorf("rule %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
			if r.Type == "alerting" && r.State == "firing" {
				t.Errorf("alert %s fires on a healthy tokenbus", r.Name)
			}
			if r.Type != "recording" {
				continue
			}
			res, err := prom.query(r.Name + `{model="` + liveModel + `"}`)
			if err != nil || len(res) == 0 {
				t.Errorf("recording rule %s: nothing for %s after the load (%v)", r.Name, liveModel, err)
			}
		}
	}
	if nrules < len(mustRecord)+len(mustAlert) {
		t.Errorf("prometheus loaded %d rules", nrules)
	}

	// The dashboard at low traffic: every query evaluates, the panels the
	// traffic fills have data, and the error ratio of a model that never
	// failed reads 0, not nothing (/metrics, /health and /ready, scraped and
	// polled all along, are no requests of the model).
	var dash grafanaDashboard
	if err := json.Unmarshal(readFile(t, "deploy/grafana/dashboards/tokenbus.json"), &dash); err != nil {
		t.Fatal(err)
	}
	mustShow := map[string]bool{"Requests by model and status": true, "Error ratio (5xx and failed streams)": true,
		"Time to first token": true, "Inter-token latency": true, "Request duration": true, "Queue depth by model": true,
		"Workers by model": true, "Load by model: running + queued": true, "Tokens per second": true, "Worker running": true}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				q := grafanaMacros.Replace(tg.Expr)
				res, err := prom.query(q)
				switch {
				case err != nil:
					t.Errorf("panel %q: %v", p.Title, err)
				case mustShow[p.Title] && len(res) == 0:
					t.Errorf("panel %q: no data after the load: %q", p.Title, q)
				}
				if p.Title != "Error ratio (5xx and failed streams)" {
					continue
				}
				for _, r := range res {
					if v, err := sampleValue(r.Value); err != nil || v != 0 || r.Metric["model"] != liveModel {
						t.Errorf("panel %q: %v = %v, want 0 for %s: no request failed", p.Title, r.Metric, r.Value, liveModel)
					}
				}
			}
		}
	}
	walk(dash.Panels)

	// Scale from zero (docs/capacity.md): a request for a registered model
	// that no worker serves is held, and the query of the chart's pool
	// scaled to zero rises above its activation threshold: KEDA would
	// start the pool's first worker.
	var cold []scaledToZero
	ms, err := renderChart(t, loadChart(t), kubeVersions[1], variantValues(t, "keda"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.kind != "ScaledObject" {
			continue
		}
		var so scaledObject
		strictJSON(t, &m, &so)
		if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount != 0 {
			continue
		}
		for _, tr := range so.Spec.Triggers {
			act, err := strconv.ParseFloat(tr.Metadata["activationThreshold"], 64)
			if err != nil {
				t.Fatalf("%s: activationThreshold %q", m, tr.Metadata["activationThreshold"])
			}
			cold = append(cold, scaledToZero{query: tr.Metadata["query"], activation: act})
		}
	}
	if len(cold) == 0 {
		t.Fatal("the keda values render no pool scaled to zero")
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+adminAddr+"/models", strings.NewReader(`{"name":"`+coldModel+`"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST /models %s: %d", coldModel, resp.StatusCode)
	}
	// Registered, idle: the series exist (the dispatchers report every
	// registered model) and stay at or below the activation threshold.
	dev.waitFor(t, "the registered model's series", func() (bool, error) {
		for _, c := range cold {
			v, err := prom.number(c.query)
			if err != nil {
				return false, err
			}
			if v > c.activation {
				t.Fatalf("scaled to zero, idle: %q = %v: want at most its activation threshold %v", c.query, v, c.activation)
			}
		}
		return true, nil
	})
	heldCtx, release := context.WithCancel(context.Background())
	heldDone := make(chan struct{})
	go func() {
		defer close(heldDone)
		hreq, _ := http.NewRequestWithContext(heldCtx, http.MethodPost, "http://"+api+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+coldModel+`","max_tokens":4,"messages":[{"role":"user","content":"cold"}]}`))
		hreq.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(hreq); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if heldCtx.Err() == nil {
				t.Errorf("the request for %s, which no worker serves, was answered %d instead of held", coldModel, resp.StatusCode)
			}
		}
	}()
	dev.waitFor(t, "a held request's demand in Prometheus", func() (bool, error) {
		for _, c := range cold {
			v, err := prom.number(c.query)
			if err != nil || !(v > c.activation) {
				return false, fmt.Errorf("%q = %v (%v)", c.query, v, err)
			}
		}
		v, err := prom.number(`sum(tokenbus_dispatcher_capacity_waiting{model="` + coldModel + `"})`)
		return err == nil && v > 0, fmt.Errorf("capacity_waiting %v (%v)", v, err)
	})
	release()
	<-heldDone
}

// coldModel is the model of the chart's pool scaled to zero
// (ci/keda-values.yaml): registered, with no worker.
const coldModel = "cold-model"

// scaledToZero is a trigger of a ScaledObject with minReplicaCount 0.
type scaledToZero struct {
	query      string
	activation float64
}
