package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Config is one run of the harness.
type Config struct {
	Scenarios []string      // names (Names()); empty: all
	Streams   int           // concurrent client streams (default 150)
	Tokens    int           // tokens per stream (default 300)
	Pace      time.Duration // the sim's decode step, about the time per token (default 20ms)
	Duration  time.Duration // closed-loop scenarios (dispatcher, redis): how long clients send (default 15s)
	Outage    time.Duration // redis: how long it stays down before its restart (default 5s)
	Repeat    int           // runs of each scenario (default 1): some faults land differently each time
	Dir       string        // where binaries, logs and data go; "" a temporary directory, removed after a clean run
	Progress  io.Writer     // progress lines; nil: none
	// Tokenbus and NATSServer, if both set, are binaries built already
	// (the test suite builds each once); else they are built into Dir.
	Tokenbus, NATSServer string
}

func (c *Config) defaults() {
	if len(c.Scenarios) == 0 {
		c.Scenarios = Names()
	}
	if c.Streams <= 0 {
		c.Streams = 150
	}
	if c.Tokens <= 0 {
		c.Tokens = 300
	}
	if c.Pace <= 0 {
		c.Pace = 20 * time.Millisecond
	}
	if c.Duration <= 0 {
		c.Duration = 15 * time.Second
	}
	if c.Outage <= 0 {
		c.Outage = 5 * time.Second
	}
	if c.Repeat <= 0 {
		c.Repeat = 1
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// Result is what one scenario measured.
type Result struct {
	Scenario string         `json:"scenario"`
	Run      int            `json:"run"` // 1 to Config.Repeat
	Fault    string         `json:"fault"`
	Streams  int            `json:"streams"` // requests sent (closed loop: more than the clients)
	Tokens   int            `json:"tokens_per_stream"`
	Done     int            `json:"completed"`
	Failed   map[string]int `json:"failed"` // by error code; conn_* and client_timeout are client-side
	// NotShaped counts failures the server answered with something other
	// than an OpenAI error object.
	NotShaped int `json:"failed_not_openai_shaped"`
	// FailedAfterFirstToken: of the failed, those that had streamed content.
	FailedAfterFirstToken int      `json:"failed_after_first_token"`
	Retried               *float64 `json:"retried"`  // nil: the product has no such metric
	Migrated              *float64 `json:"migrated"` // nil: the product has no such metric
	// TokensLost and TokensDuplicated are counted in streams that ended
	// normally ([DONE] without an error): silent damage.
	TokensLost       int `json:"tokens_lost"`
	TokensDuplicated int `json:"tokens_duplicated"`
	WrongLength      int `json:"completed_with_wrong_length"`
	// TokensUndelivered: tokens the failed streams never got.
	TokensUndelivered int     `json:"tokens_undelivered_in_failed_streams"`
	LongestStall      float64 `json:"longest_stall_s"`
	SlowestStream     float64 `json:"slowest_stream_s"`
	Probe             probe   `json:"request_after_fault"`
	// Usage (redis): requests Redis counted for the load's key, against the
	// requests that completed.
	UsageRecorded *int64   `json:"usage_recorded,omitempty"`
	LoadAvg       string   `json:"loadavg"`
	Notes         []string `json:"notes,omitempty"`
	Err           string   `json:"error,omitempty"`
}

// Report is a whole run.
type Report struct {
	Started string   `json:"started"`
	Commit  string   `json:"commit,omitempty"`
	Config  string   `json:"config"`
	Results []Result `json:"results"`
}

// Run builds tokenbus once and runs each scenario on its own processes, one
// after the other.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	var scs []scenario
	for _, n := range cfg.Scenarios {
		s, err := lookup(n)
		if err != nil {
			return nil, err
		}
		scs = append(scs, s)
	}
	dir, clean := cfg.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "tokenbus-chaos-")
		if err != nil {
			return nil, err
		}
		dir, clean = d, true
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server is not installed")
	}
	tb, nb := cfg.Tokenbus, cfg.NATSServer
	if tb == "" || nb == "" {
		fmt.Fprintf(cfg.Progress, "chaos: building into %s\n", dir)
		var err error
		if tb, nb, err = build(ctx, dir); err != nil {
			return nil, err
		}
	}
	rep := &Report{Started: time.Now().UTC().Format(time.RFC3339),
		Config: fmt.Sprintf("streams=%d tokens=%d pace=%s duration=%s outage=%s", cfg.Streams, cfg.Tokens, cfg.Pace,
			cfg.Duration, cfg.Outage)}
	for _, s := range scs {
		for run := 1; run <= cfg.Repeat && ctx.Err() == nil; run++ {
			sdir := filepath.Join(dir, fmt.Sprintf("%s-%d", s.name, run))
			if err := os.MkdirAll(sdir, 0o755); err != nil {
				return rep, err
			}
			fmt.Fprintf(cfg.Progress, "chaos: %s (run %d): %s\n", s.name, run, s.fault)
			r := runScenario(ctx, cfg, s, sdir, tb, nb)
			r.Run = run
			if r.Err != "" {
				clean = false
				fmt.Fprintf(cfg.Progress, "chaos: %s: %s (logs in %s)\n", s.name, r.Err, sdir)
			}
			rep.Results = append(rep.Results, r)
		}
	}
	if clean {
		os.RemoveAll(dir)
	}
	return rep, ctx.Err()
}

func runScenario(ctx context.Context, cfg Config, s scenario, dir, tb, nb string) (r Result) {
	r = Result{Scenario: s.name, Fault: s.fault, Tokens: cfg.Tokens, Failed: map[string]int{}, LoadAvg: loadAvg()}
	defer func() { r.LoadAvg += " → " + loadAvg() }()
	t, err := startTopology(ctx, dir, tb, nb, s.shape, cfg.Pace)
	defer t.stop()
	if err != nil {
		r.Err = "start: " + err.Error()
		return r
	}
	streamTime := time.Duration(cfg.Tokens) * cfg.Pace
	limit := streamTime + 60*time.Second
	cl := newClient(t.apiKey, cfg.Tokens, limit)
	var refTokens []string
	bases := make([]string, len(t.gateways))
	metricsURLs := slices.Clone(t.dispMetrics)
	for i, g := range t.gateways {
		bases[i] = g.base
		metricsURLs = append(metricsURLs, g.base+"/metrics")
	}
	// The reference: the same request, before any fault (also a warm-up);
	// with no worker at the start (a cold start), after the load.
	reference := func() bool {
		ref := cl.run(ctx, bases[0], 0)
		if ref.failed() || len(ref.tokens) != cfg.Tokens {
			r.Err = fmt.Sprintf("reference stream: %q, %d tokens", ref.code, len(ref.tokens))
			return false
		}
		refTokens = ref.tokens
		return true
	}
	if s.shape.workers > 0 && !reference() {
		return r
	}
	cl.chunks.Store(0)
	retried0, _ := counters(metricsURLs, "retr")
	migrated0, _ := counters(metricsURLs, "migrat")
	var usage0 int64
	if s.shape.auth {
		if usage0, err = t.usageRequests(t.gateways[0]); err != nil {
			r.Err = "usage before: " + err.Error()
			return r
		}
	}

	var until time.Time
	if s.closedLoop {
		until = time.Now().Add(cfg.Duration)
	}
	loadDone := make(chan []*stream, 1)
	go func() { loadDone <- cl.load(ctx, bases, cfg.Streams, until, streamTime) }()

	// The fault comes a third of the way in: by tokens received for a
	// single round of streams, by time for a closed loop.
	trigger := func() error {
		if s.ready != nil {
			return s.ready(t, cfg)
		}
		if s.closedLoop {
			if time.Until(until) > cfg.Duration*2/3 {
				return fmt.Errorf("not yet")
			}
			return nil
		}
		if got, want := cl.chunks.Load(), int64(cfg.Streams*cfg.Tokens/3); got < want {
			return fmt.Errorf("%d of %d tokens", got, want)
		}
		return nil
	}
	if err := waitFor(ctx, limit, "load under way", trigger); err != nil {
		r.Notes = append(r.Notes, "fault injected late: "+err.Error())
	}
	faultAt := time.Now()
	probeGW, after, err := s.inject(ctx, t, cfg)
	if err != nil {
		r.Err = "inject: " + err.Error()
	}
	probeDone := make(chan probe, 1)
	go func() { probeDone <- probeAfter(ctx, t.apiKey, bases[probeGW], faultAt) }()
	if after != nil {
		if err := after(); err != nil && r.Err == "" {
			r.Err = "after the fault: " + err.Error()
		}
	}
	r.Notes = append(r.Notes, t.notes...)
	streams := <-loadDone
	r.Probe = <-probeDone
	if s.shape.workers == 0 && !reference() {
		return r
	}

	for _, st := range streams {
		r.Streams++
		r.LongestStall = max(r.LongestStall, st.longestGap().Seconds())
		r.SlowestStream = max(r.SlowestStream, st.end.Sub(st.start).Seconds())
		lost, dup := tally(refTokens, st.tokens)
		if st.failed() {
			r.Failed[st.code]++
			if !st.shaped && !strings.HasPrefix(st.code, "conn_") && st.code != "client_timeout" {
				r.NotShaped++
			}
			if len(st.tokens) > 0 {
				r.FailedAfterFirstToken++
			}
			r.TokensUndelivered += lost
			r.TokensDuplicated += dup
			continue
		}
		r.Done++
		r.TokensLost += lost
		r.TokensDuplicated += dup
		if len(st.tokens) != cfg.Tokens {
			r.WrongLength++
		}
	}
	if v, ok := counters(metricsURLs, "retr"); ok {
		d := v - retried0
		r.Retried = &d
	}
	if v, ok := counters(metricsURLs, "migrat"); ok {
		d := v - migrated0
		r.Migrated = &d
	}
	if s.name == "gateway" && (r.Retried != nil || r.Migrated != nil) {
		r.Notes = append(r.Notes, "retries and migrations counted by the killed gateway are gone with it")
	}
	if s.shape.auth {
		// Usage is written in the background after each request: give the
		// writes in flight their bound (auth's 2 s timeout) before counting.
		var n int64
		want := usage0 + int64(r.Done)
		_ = waitFor(ctx, 5*time.Second, "usage settles", func() error {
			var err error
			if n, err = t.usageRequests(t.gateways[0]); err != nil {
				return err
			}
			if n < want {
				return fmt.Errorf("%d of %d", n-usage0, r.Done)
			}
			return nil
		})
		n -= usage0
		r.UsageRecorded = &n
	}
	return r
}

// probeAfter sends a short request right after the fault and, if it
// fails, more of them (every 100 ms, for up to 30 s) to measure when the
// system serves again.
func probeAfter(ctx context.Context, apiKey, base string, faultAt time.Time) probe {
	pc := newClient(apiKey, 16, 60*time.Second)
	ps := pc.run(ctx, base, 0)
	p := probe{Result: "ok", Seconds: ps.end.Sub(ps.start).Seconds()}
	if !ps.failed() {
		return p
	}
	p.Result = ps.code
	for time.Since(faultAt) < 30*time.Second && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		if !pc.run(ctx, base, 0).failed() {
			r := time.Since(faultAt).Seconds()
			p.RecoveredAfter = &r
			break
		}
	}
	return p
}

// loadAvg is the 1-minute load average (other programs share the machine).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
