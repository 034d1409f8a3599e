package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/internal/flagenv"
)

// config is the parsed command line.
type config struct {
	url, model             string
	endpoint               string
	concurrency            int
	requestRate            float64
	numPrompts             int
	duration               time.Duration
	inputLen, outputLen    int
	dataset                string
	sharedPrefix           int
	prefixGroups           int
	adapters               int
	adapterZipf            float64
	sessions, turns        int
	apiKey                 string
	seed                   uint64
	timeout                time.Duration
	stream, usage, ignEOS  bool
	jsonOut, plotOut       string
	jsonRequests           bool
	compareURL, compareMdl string
	rounds                 int
	warmup                 int
	quiet                  bool
}

func newFlags(cfg *config) *pflag.FlagSet {
	fs := flagenv.NewFlagSet("bench")
	fs.StringVar(&cfg.url, "url", "http://127.0.0.1:8080/v1", "base URL of the target (the system under test), including /v1; several, comma-separated (e.g. two gateways): requests take them in turn")
	fs.StringVar(&cfg.model, "model", "llama-8b", "model name sent in requests")
	fs.StringVar(&cfg.endpoint, "endpoint", "chat", "chat (/chat/completions), completions (/completions) or embeddings (/embeddings: one input per request, base64 as the SDKs ask, never streamed)")
	fs.IntVar(&cfg.concurrency, "concurrency", 64, "maximum requests in flight")
	fs.Float64Var(&cfg.requestRate, "request-rate", 0, "requests/s with Poisson arrivals; 0 or inf = all at once (bounded by --concurrency)")
	fs.IntVar(&cfg.numPrompts, "num-prompts", 256, "requests to send per endpoint (with --dataset, 0 = every line once)")
	fs.DurationVar(&cfg.duration, "duration", 0, "stop after this long even if prompts remain (0 = no cap)")
	fs.IntVar(&cfg.inputLen, "input-len", 512, "random prompt length in tokens (words from a built-in list, ~1 token each)")
	fs.IntVar(&cfg.outputLen, "output-len", 128, "max_tokens per request, with ignore_eos so engines produce exactly that many")
	fs.StringVar(&cfg.dataset, "dataset", "", `JSONL file: {"prompt": "...", "output_len": N} or {"messages": [...]} per line`)
	fs.IntVar(&cfg.sharedPrefix, "shared-prefix", 0, "every prompt begins with the same N-token prefix (prefix caching)")
	fs.IntVar(&cfg.prefixGroups, "prefix-groups", 0, "with --shared-prefix: G different prefixes (system messages in chat), prompt i gets prefix i mod G, sent in shuffled order; G = --num-prompts gives the same load with no prefix to reuse; with --sessions, session i gets system message i mod G")
	fs.IntVar(&cfg.adapters, "adapters", 0, "spread the requests over N LoRA adapters named <model>-lora-1 … <model>-lora-N (register them first), drawn Zipf-distributed: adapter k with weight 1/k^S (warmup requests go to --model)")
	fs.Float64Var(&cfg.adapterZipf, "adapter-zipf", 1.1, "with --adapters: the Zipf exponent S (> 1; larger: a few adapters take more of the load)")
	fs.IntVar(&cfg.sessions, "sessions", 0, "chat only: run S multi-turn conversations instead of --num-prompts requests (S × --turns requests): a system message of --shared-prefix words (one for all, or --prefix-groups G of them), user turns of --input-len words; each turn resends the whole history with the endpoint's own earlier answers; --num-prompts is ignored")
	fs.IntVar(&cfg.turns, "turns", 4, "with --sessions: user turns per conversation")
	fs.StringVar(&cfg.apiKey, "api-key", "", "sent as Authorization: Bearer")
	fs.Uint64Var(&cfg.seed, "seed", 0, "random seed for prompts and arrivals")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "per-request timeout")
	fs.BoolVar(&cfg.stream, "stream", true, "stream responses (false measures non-stream requests)")
	fs.BoolVar(&cfg.usage, "usage", true, "send stream_options.include_usage and require the usage chunk (false: count content chunks)")
	fs.BoolVar(&cfg.ignEOS, "ignore-eos", true, `send "ignore_eos": true (vLLM extension)`)
	fs.StringVar(&cfg.jsonOut, "json", "", "write all figures as JSON to this file")
	fs.BoolVar(&cfg.jsonRequests, "json-requests", false, "include per-request records in --json")
	fs.StringVar(&cfg.plotOut, "plot", "", "write a PNG of TTFT/ITL distributions and output tokens/s over time")
	fs.StringVar(&cfg.compareURL, "compare-url", "", "base URL of a baseline to compare the target against, same load interleaved")
	fs.StringVar(&cfg.compareMdl, "compare-model", "", "model name for the baseline (default: --model)")
	fs.IntVar(&cfg.rounds, "rounds", 8, "with --compare-url: rounds alternating target/baseline order")
	fs.IntVar(&cfg.warmup, "warmup", 0, "requests per endpoint before measuring, not counted")
	fs.BoolVar(&cfg.quiet, "quiet", false, "no progress output")
	return fs
}

func (cfg *config) validate() error {
	switch {
	case cfg.endpoint != "chat" && cfg.endpoint != "completions" && cfg.endpoint != "embeddings":
		return fmt.Errorf("--endpoint must be chat, completions or embeddings, not %q", cfg.endpoint)
	case cfg.concurrency < 1:
		return errors.New("--concurrency must be at least 1")
	case cfg.requestRate < 0 || math.IsNaN(cfg.requestRate):
		return errors.New("--request-rate must be >= 0")
	case cfg.sessions == 0 && (cfg.numPrompts < 0 || (cfg.numPrompts == 0 && cfg.dataset == "")):
		return errors.New("--num-prompts must be at least 1")
	case cfg.inputLen < 0 || cfg.outputLen < 0 || cfg.sharedPrefix < 0 || cfg.prefixGroups < 0:
		return errors.New("--input-len, --output-len, --shared-prefix and --prefix-groups must be >= 0")
	case cfg.prefixGroups > 0 && cfg.sessions == 0 && (cfg.dataset != "" || cfg.sharedPrefix == 0):
		return errors.New("--prefix-groups needs --shared-prefix and no --dataset")
	case cfg.adapters < 0 || (cfg.adapters > 0 && !(cfg.adapterZipf > 1)):
		return errors.New("--adapters must be >= 0, and --adapter-zipf > 1 with it")
	case cfg.adapters > 0 && cfg.endpoint == "embeddings":
		return errors.New("--adapters works with chat and completions only")
	case cfg.sessions < 0 || (cfg.sessions > 0 && cfg.turns < 1):
		return errors.New("--sessions must be >= 0, and --turns >= 1 with it")
	case cfg.sessions > 0 && (cfg.endpoint != "chat" || cfg.dataset != "" || cfg.adapters > 0):
		return errors.New("--sessions works with --endpoint chat only, without --dataset or --adapters")
	case cfg.prefixGroups > 0 && cfg.sessions > 0 && cfg.sharedPrefix == 0:
		return errors.New("--prefix-groups needs --shared-prefix")
	case cfg.timeout <= 0:
		return errors.New("--timeout must be positive")
	case cfg.rounds < 1:
		return errors.New("--rounds must be at least 1")
	case cfg.warmup < 0 || cfg.duration < 0:
		return errors.New("--warmup and --duration must be >= 0")
	}
	if cfg.compareMdl == "" {
		cfg.compareMdl = cfg.model
	}
	if cfg.endpoint == "embeddings" {
		cfg.stream = false // an embeddings answer is one JSON object
	}
	return nil
}

// Run is `tokenbus bench`: it parses args, runs the load and prints the report
// to stdout (progress to stderr). Cancelling ctx stops the run and prints the
// partial report, then Run returns an error wrapping ctx's.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parse(args, stdout, stderr)
	if cfg == nil || err != nil {
		return err
	}
	rep, err := run(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	writeReport(stdout, rep)
	if cfg.jsonOut != "" {
		if err := writeJSON(cfg.jsonOut, rep, cfg.jsonRequests); err != nil {
			return err
		}
	}
	if cfg.plotOut != "" {
		if err := writePlot(cfg.plotOut, rep); err != nil {
			return err
		}
	}
	if rep.Interrupted {
		return fmt.Errorf("bench interrupted, report is partial: %w", context.Cause(ctx))
	}
	for _, s := range rep.Summaries {
		if s.Sent > 0 && s.Completed == 0 && s.Failed > 0 {
			return fmt.Errorf("%s: all %d requests failed", s.Name, s.Failed)
		}
	}
	return nil
}

// parse reads and checks the command line, without dialing anything; a nil
// config and no error after --help (the usage is printed to stdout).
func parse(args []string, stdout, stderr io.Writer) (*config, error) {
	var cfg config
	fs := newFlags(&cfg)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: tokenbus bench [flags]\n\nLoad generator for an OpenAI-compatible endpoint (see `go doc github.com/tokenbus/tokenbus/bench`).\n--url is the target under test; --compare-url the baseline.\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := flagenv.Parse(fs, args, nil); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// endpoint is one side of the run: the target, or the baseline.
type endpoint struct {
	name  string
	c     *caller
	model string
	base  string

	bodies   [][]byte // one per prompt
	warmup   [][]byte
	recs     []record      // one per prompt (session turn), filled by its phases
	loadTime time.Duration // sum of its phases' durations
	began    time.Time     // wall clock at the start of its first phase (load clock 0)
}

// Report is the result of a run.
type Report struct {
	Config      map[string]any `json:"config"`
	Interrupted bool           `json:"interrupted"`
	Rounds      int            `json:"rounds"`
	Summaries   []*Summary     `json:"results"` // target first, then baseline
	Compare     *Comparison    `json:"comparison,omitempty"`
	requests    [][]record
}

func run(ctx context.Context, cfg *config, stderr io.Writer) (*Report, error) {
	var sess []sessionSpec
	prompts, err := makePrompts(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.sessions > 0 {
		sess = makeSessions(cfg.seed, cfg.sessions, cfg.turns, cfg.sharedPrefix, cfg.inputLen, cfg.outputLen, cfg.prefixGroups)
		prompts = sessionPlaceholders(sess)
	}
	units := len(prompts) // what rounds split and arrivals pace: prompts, or sessions
	if sess != nil {
		units = len(sess)
	}
	var warm []promptSpec
	if cfg.warmup > 0 {
		if cfg.dataset != "" {
			warm = takePrompts(prompts, cfg.warmup)
		} else {
			warm = randomPrompts(cfg.seed, 2, cfg.warmup, cfg.sharedPrefix, cfg.inputLen, cfg.outputLen, cfg.prefixGroups, cfg.endpoint)
		}
	}

	prog := newProgress(stderr, cfg.quiet)
	eps := []*endpoint{newEndpoint("target", cfg.url, cfg.model, cfg, prompts, warm, prog)}
	if cfg.compareURL != "" {
		eps = append(eps, newEndpoint("baseline", cfg.compareURL, cfg.compareMdl, cfg, prompts, warm, prog))
	}
	defer func() {
		for _, e := range eps {
			e.c.client.CloseIdleConnections()
		}
	}()

	for _, e := range eps {
		if err := warmupEndpoint(ctx, e, cfg, prog); err != nil {
			return nil, err
		}
	}

	// Rounds: contiguous slices of the prompts. Round r runs the endpoints in
	// order when r is even, reversed when odd; both get the same arrivals.
	rounds := 1
	if len(eps) > 1 {
		rounds = min(cfg.rounds, units)
	}
	var budget time.Duration
	if cfg.duration > 0 {
		budget = cfg.duration / time.Duration(rounds*len(eps))
	}
	prog.start(len(prompts) * len(eps))
	for r := 0; r < rounds && ctx.Err() == nil; r++ {
		lo, hi := r*units/rounds, (r+1)*units/rounds
		arr := arrivals(hi-lo, cfg.requestRate, rand.New(rand.NewPCG(cfg.seed, 1000+uint64(r))))
		order := eps
		if r%2 == 1 {
			order = []*endpoint{eps[1], eps[0]}
		}
		for _, e := range order {
			if ctx.Err() != nil {
				break
			}
			prog.phase(e.name, r, rounds)
			if sess != nil {
				runSessionPhase(ctx, e, cfg, sess, lo, hi, arr, budget, prog)
			} else {
				runPhase(ctx, e, cfg, lo, hi, arr, budget, prog)
			}
		}
	}
	prog.stop()

	rep := &Report{Config: cfg.asMap(), Interrupted: ctx.Err() != nil, Rounds: rounds}
	for _, e := range eps {
		s := &Summary{Name: e.name, URL: e.base, Model: e.model, Endpoint: cfg.endpoint, Stream: cfg.stream}
		recs := sentOnly(e.recs)
		for i := range recs {
			if recs[i].PromptTokens == 0 {
				recs[i].PromptTokens = prompts[recs[i].Prompt].inputEst
			}
		}
		summarizeRecords(s, recs, e.loadTime)
		if !e.began.IsZero() {
			s.LoadStartUnixS = float64(e.began.UnixMicro()) / 1e6
		}
		if sess != nil {
			s.Turns, s.LaterTurns = turnStats(recs, cfg.turns)
		}
		rep.Summaries = append(rep.Summaries, s)
		rep.requests = append(rep.requests, recs)
	}
	if len(eps) > 1 {
		rep.Compare = compare(rep.Summaries[0], rep.Summaries[1])
	}
	return rep, nil
}

// sentOnly drops the records of prompts never sent (Start < 0).
func sentOnly(recs []record) []record {
	out := recs[:0:0]
	for _, r := range recs {
		if r.Start >= 0 {
			out = append(out, r)
		}
	}
	return out
}

func makePrompts(cfg *config) ([]promptSpec, error) {
	if cfg.sessions > 0 {
		return nil, nil // run makes the sessions
	}
	if cfg.dataset == "" {
		return randomPrompts(cfg.seed, 1, cfg.numPrompts, cfg.sharedPrefix, cfg.inputLen, cfg.outputLen, cfg.prefixGroups, cfg.endpoint), nil
	}
	all, err := loadDataset(cfg.dataset, cfg.endpoint, sharedPrefix(cfg.seed, cfg.sharedPrefix), cfg.outputLen)
	if err != nil {
		return nil, err
	}
	return takePrompts(all, cfg.numPrompts), nil
}

// adapterPicks draws, for each of n requests, the adapter (1..cfg.adapters)
// it goes to, Zipf-distributed; nil without --adapters. Seeded apart from
// the prompts, so that the same prompts go with the same adapters.
func adapterPicks(cfg *config, n int) []int {
	if cfg.adapters <= 0 {
		return nil
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(cfg.seed, 3)), cfg.adapterZipf, 1, uint64(cfg.adapters-1))
	out := make([]int, n)
	for i := range out {
		out[i] = int(z.Uint64()) + 1
	}
	return out
}

func newEndpoint(name, base, model string, cfg *config, prompts, warm []promptSpec, prog *progress) *endpoint {
	path := "/chat/completions"
	switch cfg.endpoint {
	case "completions":
		path = "/completions"
	case "embeddings":
		path = "/embeddings"
	}
	maxChunks := cfg.outputLen + 1
	if maxChunks > 4096 {
		maxChunks = 4096
	}
	e := &endpoint{
		name:  name,
		model: model,
		base:  base,
		c: &caller{
			apiKey:    cfg.apiKey,
			chat:      cfg.endpoint == "chat",
			embed:     cfg.endpoint == "embeddings",
			stream:    cfg.stream,
			usage:     cfg.stream && cfg.usage,
			timeout:   cfg.timeout,
			client:    &http.Client{Transport: newTransport(cfg.concurrency)},
			onChunk:   prog.chunk,
			maxChunks: maxChunks,
			collect:   cfg.sessions > 0,
		},
		recs: make([]record, len(prompts)),
	}
	for _, b := range strings.Split(base, ",") {
		e.c.urls = append(e.c.urls, strings.TrimRight(strings.TrimSpace(b), "/")+path)
	}
	picks := adapterPicks(cfg, len(prompts))
	for i, p := range prompts {
		e.recs[i] = record{Prompt: i, Start: -1}
		if cfg.sessions > 0 { // bodies are built turn by turn, on the answers
			e.recs[i].Turn = i%cfg.turns + 1
			continue
		}
		m := model
		if picks != nil {
			m = fmt.Sprintf("%s-lora-%d", model, picks[i])
		}
		e.bodies = append(e.bodies, buildBody(p, m, cfg.endpoint, cfg.stream, cfg.usage, cfg.ignEOS))
	}
	for _, p := range warm {
		e.warmup = append(e.warmup, buildBody(p, model, cfg.endpoint, cfg.stream, cfg.usage, cfg.ignEOS))
	}
	return e
}

// warmupEndpoint sends the warmup requests, unmeasured. It fails only when all
// of them fail, with the first failure.
func warmupEndpoint(ctx context.Context, e *endpoint, cfg *config, prog *progress) error {
	if len(e.warmup) == 0 {
		return nil
	}
	prog.note(fmt.Sprintf("warming up %s with %d requests", e.name, len(e.warmup)))
	recs := make([]record, len(e.warmup))
	sem := make(chan struct{}, cfg.concurrency)
	var wg sync.WaitGroup
	for i, b := range e.warmup {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			e.c.do(ctx, b, &recs[i])
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted during warmup: %w", context.Cause(ctx))
	}
	for _, r := range recs {
		if r.ok() {
			return nil
		}
	}
	return fmt.Errorf("%s %s: all %d warmup requests failed, first: %s: %s", e.name, strings.Join(e.c.urls, ","), len(recs), recs[0].Err, recs[0].ErrMsg)
}

// arrivals returns n send offsets with exponential gaps of mean 1/rate (a
// Poisson process); all zero when rate is 0 or infinite.
func arrivals(n int, rate float64, rng *rand.Rand) []time.Duration {
	out := make([]time.Duration, n)
	if rate <= 0 || math.IsInf(rate, 1) {
		return out
	}
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += rng.ExpFloat64() / rate
	}
	return out
}

// runPhase sends prompts [lo, hi) to e, one at each arrival offset with at most
// --concurrency in flight, and waits for them. A budget > 0 caps the phase:
// requests still in flight then are cancelled, later ones never sent.
func runPhase(ctx context.Context, e *endpoint, cfg *config, lo, hi int, arr []time.Duration, budget time.Duration, prog *progress) {
	paced(ctx, e, cfg, lo, hi, arr, budget, func(pctx context.Context, i int, at time.Duration) {
		rec := &e.recs[i]
		rec.Start = at
		prog.inflight.Add(1)
		e.c.do(pctx, e.bodies[i], rec)
		prog.inflight.Add(-1)
		prog.finish(rec)
	})
}

// paced runs work(ctx, i, at) on its own goroutine for i in [lo, hi), each
// at its arrival offset arr[i-lo] with at most --concurrency running, and
// waits for them; at is when it started on e's load clock. A budget > 0 caps
// the phase: work still running then sees its ctx end, later work never
// starts.
func paced(ctx context.Context, e *endpoint, cfg *config, lo, hi int, arr []time.Duration, budget time.Duration,
	work func(ctx context.Context, i int, at time.Duration)) {
	var pctx context.Context
	var cancel context.CancelFunc
	if budget > 0 {
		pctx, cancel = context.WithTimeout(ctx, budget)
	} else {
		pctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	start := time.Now()
	if e.began.IsZero() {
		e.began = start
	}
	clock := e.loadTime // this phase starts where the endpoint's last one ended
	sem := make(chan struct{}, cfg.concurrency)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var wg sync.WaitGroup
dispatch:
	for i := lo; i < hi; i++ {
		if wait := time.Until(start.Add(arr[i-lo])); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-pctx.Done():
				break dispatch
			}
		}
		select {
		case sem <- struct{}{}:
		case <-pctx.Done():
			break dispatch
		}
		if pctx.Err() != nil {
			<-sem
			break
		}
		at := clock + time.Since(start)
		wg.Go(func() {
			defer func() { <-sem }()
			work(pctx, i, at)
		})
	}
	wg.Wait()
	e.loadTime += time.Since(start)
}

func (cfg *config) asMap() map[string]any {
	m := map[string]any{
		"url": cfg.url, "model": cfg.model, "endpoint": cfg.endpoint,
		"concurrency": cfg.concurrency, "num_prompts": cfg.numPrompts,
		"duration_s": cfg.duration.Seconds(), "input_len": cfg.inputLen, "output_len": cfg.outputLen,
		"dataset": cfg.dataset, "shared_prefix": cfg.sharedPrefix, "prefix_groups": cfg.prefixGroups, "adapters": cfg.adapters, "adapter_zipf": cfg.adapterZipf, "seed": cfg.seed,
		"timeout_s": cfg.timeout.Seconds(), "stream": cfg.stream, "usage": cfg.usage,
		"ignore_eos": cfg.ignEOS, "warmup": cfg.warmup,
	}
	if cfg.sessions > 0 {
		m["sessions"], m["turns"], m["num_prompts"] = cfg.sessions, cfg.turns, cfg.sessions*cfg.turns
	}
	if math.IsInf(cfg.requestRate, 1) || cfg.requestRate == 0 {
		m["request_rate"] = "inf"
	} else {
		m["request_rate"] = cfg.requestRate
	}
	if cfg.compareURL != "" {
		m["compare_url"], m["compare_model"], m["rounds"] = cfg.compareURL, cfg.compareMdl, cfg.rounds
	}
	return m
}

// progress reports on stderr: a \r-updated line twice a second on a terminal,
// otherwise a line every 10 s at most; nothing with --quiet.
type progress struct {
	w        io.Writer
	quiet    bool
	tty      bool
	every    time.Duration
	total    int
	chunks   atomic.Int64
	done     atomic.Int64
	failed   atomic.Int64
	inflight atomic.Int64

	mu    sync.Mutex
	label string
	quit  chan struct{}
	wg    sync.WaitGroup
}

func newProgress(w io.Writer, quiet bool) *progress {
	p := &progress{w: w, quiet: quiet, every: 10 * time.Second}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty, p.every = true, 500*time.Millisecond
		}
	}
	return p
}

func (p *progress) chunk() { p.chunks.Add(1) }

func (p *progress) finish(r *record) {
	p.done.Add(1)
	if r.Err != "" {
		p.failed.Add(1)
	}
}

func (p *progress) note(s string) {
	if !p.quiet {
		fmt.Fprintln(p.w, s)
	}
}

func (p *progress) phase(name string, r, rounds int) {
	p.mu.Lock()
	if rounds > 1 {
		p.label = fmt.Sprintf("%s round %d/%d", name, r+1, rounds)
	} else {
		p.label = name
	}
	p.mu.Unlock()
}

func (p *progress) start(total int) {
	p.total = total
	if p.quiet {
		return
	}
	p.quit = make(chan struct{})
	p.wg.Go(func() {
		t := time.NewTicker(p.every)
		defer t.Stop()
		last, lastAt := int64(0), time.Now()
		for {
			select {
			case <-p.quit:
				if p.tty {
					fmt.Fprint(p.w, "\r\033[K")
				}
				return
			case now := <-t.C:
				c := p.chunks.Load()
				rate := float64(c-last) / now.Sub(lastAt).Seconds()
				last, lastAt = c, now
				p.mu.Lock()
				label := p.label
				p.mu.Unlock()
				line := fmt.Sprintf("%s: %d/%d done, %d failed, %d in flight, ~%.0f tok/s",
					label, p.done.Load(), p.total, p.failed.Load(), p.inflight.Load(), rate)
				if p.tty {
					fmt.Fprint(p.w, "\r\033[K"+line)
				} else {
					fmt.Fprintln(p.w, line)
				}
			}
		}
	})
}

func (p *progress) stop() {
	if p.quit != nil {
		close(p.quit)
		p.wg.Wait()
		p.quit = nil
	}
}
