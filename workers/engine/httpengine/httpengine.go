package httpengine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Config is what the HTTP engines share. Zero values take the defaults shown.
type Config struct {
	// URL is the server's root, e.g. http://127.0.0.1:8000; a trailing /v1 is
	// dropped, so an OpenAI base URL works too. With Command set and URL empty
	// it comes from the command's --host and --port.
	URL    string
	APIKey string // sent as "Authorization: Bearer" on every request
	// RequestID is how a request's id is sent in X-Request-Id: RequestIDRaw
	// (the default here and for vllm), RequestIDUUID (the openai engine's
	// default: strict servers refuse other ids) or RequestIDOff.
	RequestID string
	// KnownModelsOnly: a request for a model outside Models() is answered
	// 404 model_not_found here (as vLLM would) instead of going to a server
	// that may answer otherwise (transformers serve: 400 "Server is pinned
	// to ..."). The openai engine sets it; vLLM answers 404 itself.
	KnownModelsOnly bool

	// Models are the model names to advertise; empty: ask GET /v1/models.
	Models         []string
	ModelsInterval time.Duration // how often /v1/models is read again; default 10s

	// HealthPath is probed with GET when the server is idle; default
	// "/v1/models" (vllm: "/health"). A 404 there fails WaitReady at once.
	HealthPath string
	// HealthInterval is how often health is judged: from the requests'
	// outcomes, else a probe when idle (see healthLoop). Default 1s;
	// negative: never probe (healthy while the child process runs).
	HealthInterval time.Duration
	HealthTimeout  time.Duration // per probe; default 5s

	ConnectTimeout time.Duration // TCP connect; default 5s
	// StallTimeout aborts a stream whose server sent nothing (not even the
	// response headers) for this long. Default 60s.
	StallTimeout time.Duration
	// ResponseTimeout bounds a non-stream request (the server answers only
	// when the whole completion is done). Default 30m. The request's own
	// deadline applies as well.
	ResponseTimeout     time.Duration
	MaxIdleConnsPerHost int   // default 1024
	MaxResponseBytes    int64 // largest non-stream or error body; default 64 MiB
	MaxLineBytes        int   // longest SSE line; default 16 MiB

	// Command, when set, starts the server as a child process (run by
	// /bin/sh -c, in its own process group), restarted when it dies and
	// stopped on Close.
	Command           string
	Env               []string      // added to the child's environment, KEY=VALUE
	StartTimeout      time.Duration // a child not healthy this long after its start is killed and restarted; default 20m
	StopGrace         time.Duration // SIGTERM, then SIGKILL after this; default 30s
	RestartBackoff    time.Duration // first restart delay, doubled up to MaxRestartBackoff; default 1s
	MaxRestartBackoff time.Duration // default 1m

	// Logger gets the engine's events and the child's output, a record per
	// line (attrs engine, pid, stream). Default: slog.Default().
	Logger *slog.Logger
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.ModelsInterval, 10*time.Second)
	def(&c.HealthInterval, time.Second)
	def(&c.HealthTimeout, 5*time.Second)
	def(&c.ConnectTimeout, 5*time.Second)
	def(&c.StallTimeout, 60*time.Second)
	def(&c.ResponseTimeout, 30*time.Minute)
	def(&c.StartTimeout, 20*time.Minute)
	def(&c.StopGrace, 30*time.Second)
	def(&c.RestartBackoff, time.Second)
	def(&c.MaxRestartBackoff, time.Minute)
	if c.RequestID == "" {
		c.RequestID = RequestIDRaw
	}
	if c.HealthPath == "" {
		c.HealthPath = "/v1/models"
	}
	if c.MaxIdleConnsPerHost <= 0 {
		c.MaxIdleConnsPerHost = 1024
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = 64 << 20
	}
	if c.MaxLineBytes <= 0 {
		c.MaxLineBytes = 16 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Hooks let an engine built on this one change a step.
type Hooks struct {
	// RefreshModels replaces the model refresh (by default GET /v1/models and
	// every id served). It runs every ModelsInterval, when the server turns
	// healthy and after RefreshSoon, from a goroutine New starts: it gets the
	// engine, as New may not have returned yet.
	RefreshModels func(ctx context.Context, e *Engine) error
}

// Engine is an OpenAI-compatible HTTP server as an engine.Engine.
type Engine struct {
	name string
	cfg  Config
	base string // URL without a trailing slash or /v1
	log  *slog.Logger
	// gen carries generation requests, their outcomes watched. It is called
	// as a RoundTripper, not through an http.Client: a client copies the
	// headers and sets up redirect handling for every request (a few
	// percent of the CPU per request), and an engine that redirects a
	// generation is answered as an error, not followed.
	gen *watchTransport
	// bareClient (the same transport) makes probes and control calls: their
	// answers say nothing of generation (vLLM serves /metrics with its
	// engine dead).
	bareClient *http.Client
	hooks      Hooks

	outcomes            outcomes
	noPath              atomic.Bool // the last probe answered 404: see WaitReady
	probedOK            atomic.Bool // a probe has passed once
	inflight            atomic.Int64
	health              atomic.Pointer[healthState]
	models              atomic.Pointer[[]string]
	engine.ModelsNotice                                // tells the worker of SetModels's changes
	lens                atomic.Pointer[map[string]int] // max_model_len by base model, from /v1/models
	refresh             chan struct{}                  // asks the models loop for an early refresh

	abortMu sync.Mutex
	abort   context.Context // cancelled (with a cause) to end every request in flight
	abortFn context.CancelCauseFunc

	proc      *process // nil when attached by URL
	stop      chan struct{}
	loops     sync.WaitGroup
	closeOnce sync.Once
}

var errClosed = schemas.ErrShuttingDown.New("engine")

// New starts an engine named name (what Name returns) on cfg: the background
// health and model loops, and the child process if cfg.Command is set. It
// does not wait for the server: Health fails until it answers (see
// WaitReady).
func New(name string, cfg Config, hooks Hooks) (*Engine, error) {
	cfg.defaults()
	if cfg.URL == "" && cfg.Command != "" {
		cfg.URL = URLFromCommand(cfg.Command, 0)
	}
	if cfg.URL == "" {
		return nil, fmt.Errorf("%s engine: no URL (and no --port in the command)", name)
	}
	if err := checkRequestID(cfg.RequestID); err != nil {
		return nil, fmt.Errorf("%s engine: %v", name, err)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s engine: URL %q is not an http(s) URL", name, cfg.URL)
	}
	base := strings.TrimRight(cfg.URL, "/")
	base = strings.TrimSuffix(base, "/v1")
	e := &Engine{
		name:    name,
		cfg:     cfg,
		base:    base,
		log:     cfg.Logger.With("engine", name),
		hooks:   hooks,
		refresh: make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
	std := newTransport(&cfg)
	var tr http.RoundTripper = std
	if h1 := newH1Transport(std, u, &cfg); h1 != nil {
		tr = h1
	}
	e.bareClient = &http.Client{Transport: tr}
	e.gen = &watchTransport{rt: tr, o: &e.outcomes}
	if e.hooks.RefreshModels == nil {
		e.hooks.RefreshModels = e.refreshAll
	}
	e.abort, e.abortFn = context.WithCancelCause(context.Background())
	e.health.Store(&healthState{err: schemas.ErrEngineUnhealthy.New(name, base, "not checked yet"), since: time.Now()})
	static := slices.Clone(cfg.Models)
	e.models.Store(&static)
	if cfg.Command != "" {
		e.proc = newProcess(e)
		e.loops.Add(1)
		go func() { defer e.loops.Done(); e.proc.run(e.stop) }()
	}
	e.loops.Add(2)
	go func() { defer e.loops.Done(); e.healthLoop() }()
	go func() { defer e.loops.Done(); e.modelsLoop() }()
	return e, nil
}

func newTransport(cfg *Config) *http.Transport {
	d := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment, // never for localhost
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		// SSE must not sit in a gzip reader's buffer.
		DisableCompression: true,
		// Every connection holds both while its stream runs: 10,000 streams
		// held 640 MB at 32 KiB each. A fast engine's events (a chunk each)
		// are read through the read buffer, a syscall per buffer full:
		// 16 KiB took 12 % less CPU per token than 4 KiB on a zero-latency
		// engine. Request bodies are written in one go.
		ReadBufferSize:  16 << 10,
		WriteBufferSize: 4 << 10,
	}
}

// Name is the engine's name.
func (e *Engine) Name() string { return e.name }

// URL is the server's root URL.
func (e *Engine) URL() string { return e.base }

// Logger is the engine's logger.
func (e *Engine) Logger() *slog.Logger { return e.log }

// InFlight is the number of requests this engine has running on the server.
func (e *Engine) InFlight() int { return int(e.inflight.Load()) }

// Models lists the models served, as last read from the server (or the
// configured list).
func (e *Engine) Models() []string { return slices.Clone(*e.models.Load()) }

// SetModels replaces the model list (for a RefreshModels hook); a change is
// told to the function NotifyModels set (engine.ModelsNotifier).
func (e *Engine) SetModels(m []string) {
	m = slices.Clone(m)
	if old := e.models.Swap(&m); old == nil || !slices.Equal(*old, m) {
		e.ModelsChanged()
	}
}

// MaxModelLens is the context length of each base model that the server's
// /v1/models reported (vLLM's max_model_len); nil when none did.
func (e *Engine) MaxModelLens() map[string]int {
	if p := e.lens.Load(); p != nil {
		return *p
	}
	return nil
}

// SetMaxModelLens keeps the max_model_len of the base models (no parent) of
// a /v1/models answer (for a RefreshModels hook).
func (e *Engine) SetMaxModelLens(ms []Model) {
	var lens map[string]int
	for _, m := range ms {
		if m.Parent == "" && m.MaxModelLen > 0 {
			if lens == nil {
				lens = map[string]int{}
			}
			lens[m.ID] = m.MaxModelLen
		}
	}
	e.lens.Store(&lens)
}

// RefreshSoon asks the models loop for a refresh now; it does not wait.
func (e *Engine) RefreshSoon() {
	select {
	case e.refresh <- struct{}{}:
	default:
	}
}

// Stats is the load the engine knows by itself: its own requests in flight.
func (e *Engine) Stats() engine.Stats { return engine.Stats{Running: e.InFlight()} }

// Health returns the last health verdict (a *schemas.Error 503 when bad),
// or after Close a 503 shutting_down. It does no I/O.
func (e *Engine) Health(context.Context) error {
	if e.closed() {
		return errClosed
	}
	return e.health.Load().err
}

// WaitReady blocks until the server is healthy or ctx ends. A health path
// that answers 404 fails it at once: waiting would not change that.
func (e *Engine) WaitReady(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var healthySince time.Time
	for {
		// Ready: healthy and the model list known (a worker that advertised
		// no models would get no requests); a server whose list stays empty
		// is taken as ready after a few seconds all the same.
		// A 404 on the health path fails at once, whatever the other
		// requests' outcomes say: it is a configuration error.
		if e.noPath.Load() {
			return fmt.Errorf("%s engine not ready: GET %s at %s answered 404 Not Found: %w", e.name, e.cfg.HealthPath, e.base, ErrNoHealthPath)
		}
		if err := e.health.Load().err; err == nil {
			if healthySince.IsZero() {
				healthySince = time.Now()
			}
			if len(*e.models.Load()) > 0 || time.Since(healthySince) > 5*time.Second {
				return nil
			}
		} else {
			healthySince = time.Time{}
		}
		select {
		case <-ctx.Done():
			err := e.health.Load().err
			if e.proc != nil {
				if last := e.proc.lastExit(); last != "" {
					return fmt.Errorf("%s engine not ready: %v (child process: %s)", e.name, err, last)
				}
			}
			return fmt.Errorf("%s engine not ready: %v", e.name, err)
		case <-e.stop:
			return errClosed
		case <-t.C:
		}
	}
}

// Close ends the requests in flight, stops the loops and the child process.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.abortAll(errClosed)
		close(e.stop)
		e.loops.Wait()
		e.bareClient.CloseIdleConnections() // the generation client's too: one transport
	})
	return nil
}

func (e *Engine) closed() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

// abortCtx is the context whose cancellation ends every request in flight.
func (e *Engine) abortCtx() context.Context {
	e.abortMu.Lock()
	defer e.abortMu.Unlock()
	return e.abort
}

// abortAll ends every request in flight with cause; later ones are not affected.
func (e *Engine) abortAll(cause error) {
	e.abortMu.Lock()
	defer e.abortMu.Unlock()
	e.abortFn(cause)
	if !errors.Is(cause, errClosed) {
		e.abort, e.abortFn = context.WithCancelCause(context.Background())
	}
}

// newRequest makes a request to path on the server with the API key set.
func (e *Engine) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var rd io.Reader // a nil []byte must stay a nil body, not an empty one
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r, err := http.NewRequestWithContext(ctx, method, e.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	if e.cfg.APIKey != "" {
		r.Header.Set("Authorization", "Bearer "+e.cfg.APIKey)
	}
	return r, nil
}

// URLFromCommand derives a server URL from a command line's --host and
// --port (or --port=N); without --port it uses defaultPort, and with
// defaultPort 0 it returns "". A wildcard or missing host becomes 127.0.0.1.
func URLFromCommand(cmd string, defaultPort int) string {
	host, port := FlagValue(cmd, "--host"), FlagValue(cmd, "--port")
	if port == "" {
		if defaultPort == 0 {
			return ""
		}
		port = fmt.Sprint(defaultPort)
	}
	switch host {
	case "", "0.0.0.0", "::", "[::]":
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(strings.Trim(host, "[]"), port)
}

// FlagValue finds "--name value" or "--name=value" among cmd's
// whitespace-separated fields ("" if absent).
func FlagValue(cmd, name string) string {
	f := strings.Fields(cmd)
	for i, a := range f {
		if a == name && i+1 < len(f) {
			return strings.Trim(f[i+1], `'"`)
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return strings.Trim(v, `'"`)
		}
	}
	return ""
}

// Call makes a control request (a JSON body, or none when body is nil) to
// path and reads the answer, up to MaxResponseBytes. A server that cannot be
// reached is a 503 engine_unhealthy; ctx's own error comes back as is.
func (e *Engine) Call(ctx context.Context, method, path string, body []byte) (status int, answer []byte, err error) {
	req, err := e.newRequest(ctx, method, path, body)
	if err != nil {
		return 0, nil, schemas.ErrInternal.New("building the engine request: " + err.Error())
	}
	resp, err := e.bareClient.Do(req)
	if err == nil {
		defer resp.Body.Close()
		answer, err = io.ReadAll(io.LimitReader(resp.Body, e.cfg.MaxResponseBytes))
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, context.Cause(ctx)
		}
		return 0, nil, schemas.ErrEngineUnhealthy.New(e.name, e.base, "unreachable: "+err.Error())
	}
	return resp.StatusCode, answer, nil
}
