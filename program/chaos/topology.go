package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/internal/freeport"
)

// model is the one model the sim workers serve.
const model = "llama-8b"

// shape is what a scenario runs: how many of each process, and how.
type shape struct {
	natsNodes   int  // 1: a single server; 3: a cluster
	gateways    int  // each with its own HTTP and admin port
	embed       bool // gateways embed a dispatcher
	dispatchers int  // standalone dispatchers
	workers     int
	auth        bool // gateways require API keys (usage is counted per key)
	// prefill: this many prefill workers (worker --role prefill), the
	// workers of role decode, and gateways that disaggregate every request
	// (docs/disaggregation.md).
	prefill int
}

// topology is a running set of processes for one scenario.
type topology struct {
	dir        string
	tokenbus   string
	adminToken string
	apiKey     string // with auth: the key every request sends
	keyID      string

	nats        []*natsNode
	redis       *proc
	redisPort   int
	gateways    []*gatewayProc
	dispatchers []*proc
	dispMetrics []string // their /metrics URLs
	workers     []*proc
	workerIDs   []string
	prefills    []*proc // prefill workers (shape.prefill)
	role        string  // the workers' --role ("": none given)
	// workerMetrics: the /metrics URLs of the workers, then the prefill workers.
	workerMetrics []string
	all           []*proc // start order; stopped in reverse
	notes         []string
	pace          time.Duration // the sim workers' decode step
}

// note keeps a fact about the fault for the report.
func (t *topology) note(s string) { t.notes = append(t.notes, s) }

type natsNode struct {
	*proc
	port, monitor int
}

type gatewayProc struct {
	*proc
	base, admin string // http://127.0.0.1:port
}

func (t *topology) natsURLs() string {
	urls := make([]string, len(t.nats))
	for i, n := range t.nats {
		urls[i] = "nats://127.0.0.1:" + strconv.Itoa(n.port)
	}
	return strings.Join(urls, ",")
}

func (t *topology) redisURL() string { return "redis://127.0.0.1:" + strconv.Itoa(t.redisPort) + "/0" }

func (t *topology) newProc(name, bin string, args []string, env ...string) *proc {
	p := &proc{name: name, bin: bin, args: args, env: env, log: filepath.Join(t.dir, name+".log")}
	t.all = append(t.all, p)
	return p
}

// startTopology starts NATS, Redis, workers, dispatchers and gateways, and
// returns once every gateway (and dispatcher) sees every worker.
func startTopology(ctx context.Context, dir, tokenbus, natsBin string, s shape, pace time.Duration) (*topology, error) {
	t := &topology{dir: dir, tokenbus: tokenbus, adminToken: "chaos-admin-token"}
	if err := t.startNATS(ctx, natsBin, s.natsNodes); err != nil {
		return t, err
	}
	if err := t.startRedis(ctx); err != nil {
		return t, err
	}
	common := func(name string) []string {
		return []string{"--nats-url", t.natsURLs(), "--redis-url", t.redisURL(), "--log-level", "warn"}
	}
	t.pace = pace
	if s.prefill > 0 {
		t.role = "decode"
	}
	for range s.workers {
		if err := t.startWorker(); err != nil {
			return t, err
		}
	}
	for range s.prefill {
		if err := t.startPrefillWorker(); err != nil {
			return t, err
		}
	}
	for i := range s.dispatchers {
		name := fmt.Sprintf("dispatcher%d", i)
		mp, err := freeport.TCP()
		if err != nil {
			return t, err
		}
		args := append([]string{"dispatcher"}, common(name)...)
		args = append(args, "--dispatcher-id", name, "--metrics", "127.0.0.1:"+strconv.Itoa(mp))
		p := t.newProc(name, tokenbus, args)
		if err := p.start(); err != nil {
			return t, err
		}
		t.dispatchers = append(t.dispatchers, p)
		t.dispMetrics = append(t.dispMetrics, "http://127.0.0.1:"+strconv.Itoa(mp)+"/metrics")
	}
	for i := range s.gateways {
		name := fmt.Sprintf("gateway%d", i)
		ports, err := freePorts(2)
		if err != nil {
			return t, err
		}
		args := append([]string{"gateway"}, common(name)...)
		args = append(args, "--http", "127.0.0.1:"+strconv.Itoa(ports[0]), "--admin", "127.0.0.1:"+strconv.Itoa(ports[1]),
			"--auth="+strconv.FormatBool(s.auth), "--embed-dispatcher="+strconv.FormatBool(s.embed),
			"--shutdown-timeout", "1s")
		if s.prefill > 0 { // every prompt (the same one: no prefix record, or it would be "cached")
			args = append(args, "--disagg-min-prompt-tokens", "1", "--no-prefix-routing")
		}
		p := t.newProc(name, tokenbus, args, "TOKENBUS_ADMIN_TOKEN="+t.adminToken)
		if err := p.start(); err != nil {
			return t, err
		}
		t.gateways = append(t.gateways, &gatewayProc{proc: p,
			base:  "http://127.0.0.1:" + strconv.Itoa(ports[0]),
			admin: "http://127.0.0.1:" + strconv.Itoa(ports[1])})
	}
	for _, g := range t.gateways {
		if err := waitFor(ctx, 60*time.Second, g.name+" sees every worker", t.seesWorkers(g, len(t.workers)+len(t.prefills))); err != nil {
			return t, err
		}
	}
	if s.workers == 0 {
		// No worker registers the model: the admin API does, so that its
		// requests are held for a worker rather than refused (404).
		if err := t.adminJSON(t.gateways[0], http.MethodPost, "/models", map[string]any{"name": model}, nil); err != nil {
			return t, fmt.Errorf("POST /models: %w", err)
		}
	}
	for i, url := range t.dispMetrics {
		want := fmt.Sprintf(`tokenbus_dispatcher_workers{model="%s"} %d`, model, len(t.workers))
		if err := waitFor(ctx, 60*time.Second, t.dispatchers[i].name+" sees every worker", metricLine(url, want)); err != nil {
			return t, err
		}
	}
	if s.auth {
		if err := t.makeKey(ctx); err != nil {
			return t, err
		}
	}
	return t, nil
}

// startWorker starts one more sim worker, chaos-w<n>.
func (t *topology) startWorker() error {
	id := fmt.Sprintf("chaos-w%d", len(t.workers))
	mp, err := freeport.TCP()
	if err != nil {
		return err
	}
	args := []string{"worker", "--nats-url", t.natsURLs(), "--redis-url", t.redisURL(), "--log-level", "warn",
		"--id", id, "--metrics", "127.0.0.1:" + strconv.Itoa(mp),
		"--sim-decode-base", t.pace.String(), "--sim-max-num-seqs", "512"}
	if t.role != "" {
		args = append(args, "--role", t.role)
	}
	p := t.newProc(id, t.tokenbus, args)
	if err := p.start(); err != nil {
		return err
	}
	t.workers = append(t.workers, p)
	t.workerIDs = append(t.workerIDs, id)
	t.workerMetrics = append(t.workerMetrics, "http://127.0.0.1:"+strconv.Itoa(mp)+"/metrics")
	return nil
}

// startPrefillWorker starts one more prefill worker, chaos-p<n>, whose
// prefills take prefillTime: a fault finds some under way.
func (t *topology) startPrefillWorker() error {
	id := fmt.Sprintf("chaos-p%d", len(t.prefills))
	mp, err := freeport.TCP()
	if err != nil {
		return err
	}
	args := []string{"worker", "--nats-url", t.natsURLs(), "--redis-url", t.redisURL(), "--log-level", "warn",
		"--id", id, "--metrics", "127.0.0.1:" + strconv.Itoa(mp), "--role", "prefill",
		"--sim-prefill-base", prefillTime.String(), "--sim-max-num-seqs", "512"}
	p := t.newProc(id, t.tokenbus, args)
	if err := p.start(); err != nil {
		return err
	}
	t.prefills = append(t.prefills, p)
	t.workerMetrics = append(t.workerMetrics, "http://127.0.0.1:"+strconv.Itoa(mp)+"/metrics")
	return nil
}

// prefillTime is a chaos prefill worker's prefill step: long enough that a
// kill finds prefills under way.
const prefillTime = 150 * time.Millisecond

func (t *topology) startNATS(ctx context.Context, bin string, n int) error {
	ports, err := freePorts(3 * n)
	if err != nil {
		return err
	}
	var routes []string
	for i := range n {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(ports[3*i+2]))
	}
	for i := range n {
		name := fmt.Sprintf("nats%d", i)
		args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(ports[3*i]), "-m", strconv.Itoa(ports[3*i+1]),
			"-n", name, "-js", "-sd", filepath.Join(t.dir, name+"-js")}
		if n > 1 {
			args = append(args, "--cluster_name", "chaos", "--cluster", routes[i], "--routes", strings.Join(routes, ","))
		}
		node := &natsNode{proc: t.newProc(name, bin, args), port: ports[3*i], monitor: ports[3*i+1]}
		if err := node.start(); err != nil {
			return err
		}
		t.nats = append(t.nats, node)
	}
	for _, node := range t.nats {
		if err := waitFor(ctx, 30*time.Second, node.name+" healthy", httpOK(node.healthz())); err != nil {
			return err
		}
	}
	return nil
}

func (n *natsNode) healthz() string {
	return "http://127.0.0.1:" + strconv.Itoa(n.monitor) + "/healthz"
}

// clients names the client connections of the node (its /connz): which
// tokenbus processes a kill of it cuts off.
func (n *natsNode) clients() []string {
	resp, err := probeClient.Get("http://127.0.0.1:" + strconv.Itoa(n.monitor) + "/connz")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var v struct {
		Conns []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return nil
	}
	out := make([]string, 0, len(v.Conns))
	for _, c := range v.Conns {
		out = append(out, cmp.Or(c.Name, "(unnamed)"))
	}
	slices.Sort(out)
	return out
}

// startRedis runs redis-server with an append-only file synced at every
// write, so a kill -9 and a restart keep what was written: what is lost is
// only what never reached it.
func (t *topology) startRedis(ctx context.Context) error {
	port, err := freeport.TCP()
	if err != nil {
		return err
	}
	rdir := filepath.Join(t.dir, "redis")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return err
	}
	t.redisPort = port
	t.redis = t.newProc("redis", "redis-server", []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", rdir, "--save", "", "--appendonly", "yes", "--appendfsync", "always"})
	if err := t.redis.start(); err != nil {
		return err
	}
	return waitFor(ctx, 15*time.Second, "redis up", tcpUp(port))
}

func (t *topology) seesWorkers(g *gatewayProc, n int) func() error {
	return func() error {
		var rows []json.RawMessage
		if err := t.adminJSON(g, http.MethodGet, "/workers", nil, &rows); err != nil {
			return err
		}
		if len(rows) != n {
			return fmt.Errorf("%d workers of %d", len(rows), n)
		}
		return nil
	}
}

func (t *topology) adminJSON(g *gatewayProc, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, g.admin+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+t.adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	// /workers may answer an object holding the list, or the list itself.
	if err := json.Unmarshal(b, out); err != nil {
		var wrapped map[string]json.RawMessage
		if json.Unmarshal(b, &wrapped) == nil {
			for _, v := range wrapped {
				if json.Unmarshal(v, out) == nil {
					return nil
				}
			}
		}
		return fmt.Errorf("%s %s: %v: %s", method, path, err, b)
	}
	return nil
}

// makeKey creates the API key the load sends, through the admin API.
func (t *topology) makeKey(ctx context.Context) error {
	var k struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	body := map[string]any{"name": "chaos", "tenant": "chaos", "models": []string{model}}
	if err := t.adminJSON(t.gateways[0], http.MethodPost, "/keys", body, &k); err != nil {
		return err
	}
	if k.Key == "" || k.ID == "" {
		return fmt.Errorf("POST /keys: no key or id in the answer")
	}
	t.apiKey, t.keyID = k.Key, k.ID
	return nil
}

// usageRequests is the number of requests Redis holds usage for, for the
// load's key (through the admin API, which reads registry.Store.Usage).
func (t *topology) usageRequests(g *gatewayProc) (int64, error) {
	var rows []struct {
		Model    string `json:"model"`
		Requests int64  `json:"requests"`
	}
	if err := t.adminJSON(g, http.MethodGet, "/usage?key_id="+t.keyID, nil, &rows); err != nil {
		return 0, err
	}
	var n int64
	for _, r := range rows {
		n += r.Requests
	}
	return n, nil
}

// stop ends every process, last started first.
func (t *topology) stop() {
	for i := len(t.all) - 1; i >= 0; i-- {
		t.all[i].stop(5 * time.Second)
	}
}

// metricLine is a condition: the /metrics page at url has a line that
// starts with want.
func metricLine(url, want string) func() error {
	return func() error {
		resp, err := probeClient.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, want) {
				return nil
			}
		}
		return fmt.Errorf("no %q", want)
	}
}

// counters sums the counters whose name contains one of the words, over
// every /metrics page that answers; ok is false when no page has any such
// series (the product does not count them yet).
func counters(urls []string, word string) (sum float64, ok bool) {
	return sumLines(urls, func(name string) bool {
		base, _, _ := strings.Cut(name, "{")
		return strings.HasSuffix(base, "_total") && strings.Contains(base, word)
	})
}

// sumCounters sums the samples whose series begins with prefix (a metric
// name and its first labels, e.g. `x_total{outcome="lost"`).
func sumCounters(urls []string, prefix string) (sum float64, ok bool) {
	return sumLines(urls, func(name string) bool { return strings.HasPrefix(name, prefix) })
}

// sumLines sums the samples whose series (name and labels) match, on the
// /metrics pages at urls.
func sumLines(urls []string, match func(series string) bool) (sum float64, ok bool) {
	for _, url := range urls {
		resp, err := probeClient.Get(url)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "#") {
				continue
			}
			name, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
			if !match(name) {
				continue
			}
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				sum += v
				ok = true
			}
		}
	}
	return sum, ok
}

// gauges sums the sample of series (a name with its labels, as /metrics
// prints it) over the /metrics pages at urls; ok is false when none had it.
func gauges(urls []string, series string) (sum float64, ok bool) {
	return sumLines(urls, func(name string) bool { return name == series })
}
