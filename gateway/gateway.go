package gateway

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/gateway/httpstream"
	"github.com/tokenbus/tokenbus/responses"
	"github.com/tokenbus/tokenbus/schemas"
)

// Config tunes a Gateway. Zero values take the defaults shown.
type Config struct {
	BodyLimit      int           // bytes; past it 413. Default 8 MiB
	RequestTimeout time.Duration // whole-request deadline, also sent on the bus. Default 10m
	ProbeInterval  time.Duration // how often a silent request checks its client is still there. Default 1s
	StuckTimeout   time.Duration // a client that takes no bytes while frames wait this long is cut. Default 30s
	// HoldKeepalive: a stream whose request waits for capacity that is not
	// up (a cold start, docs/capacity.md) commits its 200 after this long
	// and gets an SSE comment line this often until its first token, so that
	// proxies and clients do not time it out. Default 5s; negative: never
	// (the client waits in silence, and errors keep their status).
	HoldKeepalive time.Duration
	// ReadyWithoutWorkers: /ready needs NATS only, not a live worker. For a
	// deployment that scales workers to zero (docs/capacity.md): requests
	// then wait for a worker to start, and a load balancer that routes only
	// to ready gateways would otherwise turn away the very requests that
	// start one.
	ReadyWithoutWorkers bool
	ShutdownTimeout     time.Duration // Shutdown's grace when its context has no deadline. Default 10s
	ReadTimeout         time.Duration // for reading a request's headers and body. Default 1m
	IdleTimeout         time.Duration // keep-alive connections with no request. Default 2m
	Version             string        // the tokenbus version, for /version and /ready
	// FlowFromUser: a request with no tenant (no API keys) belongs to the
	// flow its "user" field names, so that flow control shares capacity
	// fairly between an application's end users (docs/scheduling.md). Off
	// by default: any client can write any "user".
	FlowFromUser bool
	// CORS lets browser pages of other origins call the API; its zero value
	// is off.
	CORS CORSConfig
	// Metrics is what /metrics shows; nil: the registry New is given.
	Metrics prometheus.Gatherer
	// Redactor cleans what error bodies and log lines quote of a request
	// (model names, paths): nil redacts key-shaped strings only; give it the
	// process's own secrets (admin token, NATS credentials).
	Redactor *Redactor

	// Authorize, if set, is called for every completion request after its
	// body is parsed and before it is published; req is the body's view
	// (req.Model the resolved model; it and its strings alias fasthttp's
	// buffers: copy what outlives the call). An error rejects the request (a
	// *schemas.Error keeps its status, e.g. 401, 403 or 429 with
	// RetryAfter). Response headers it sets (e.g. x-ratelimit-*) are sent
	// with the response, error or not. The principal's tenant travels on the
	// bus; the principal's fields go into the request's UsageRecord.
	Authorize func(c *fiber.Ctx, req *schemas.Request) (Principal, error)
	// ModelAccess, if set, is called for every GET .../models and
	// .../models/{id}: it authenticates the request (no rate limit) and
	// returns which models and adapters the caller may see. An error
	// rejects the request; a model it may not see is a 404 on
	// .../models/{id}, as if it did not exist.
	ModelAccess func(c *fiber.Ctx) (allowed func(model string) bool, err error)
	// OnUsage, if set, is called once per request that finished with a done
	// frame, with its record: request id, the principal's key, tenant and
	// reservation, the model and the usage from the done payload's top level.
	// It may be called from a stream writer goroutine and must not block.
	OnUsage func(rec schemas.UsageRecord)

	// Batches, if set, serves the Files and Batches APIs (/v1/files,
	// /v1/batches) from this store; nil leaves them unknown URLs.
	Batches *batch.Store
	// FileLimit bounds an uploaded file in bytes. Default 200 MB (OpenAI's).
	FileLimit int64
	// UploadsMax and UploadsPerTenant bound the uploads this gateway reads
	// at once, in all (past it 503 uploads_busy) and of one tenant (429
	// too_many_uploads), both before the body is read. Defaults 16 and 4.
	UploadsMax, UploadsPerTenant int
	// Identify, if set, authenticates a Files or Batches request (no rate
	// limit) and returns whom it is for: files and batches belong to the
	// principal's tenant. nil: every caller is the tenant "".
	Identify func(c *fiber.Ctx) (Principal, error)

	// Responses, if set, keeps responses (store, previous_response_id) and
	// runs background ones; nil serves /v1/responses with neither.
	// Responses belong to the tenant Identify gives.
	Responses *responses.Store
}

func (c *Config) defaults() {
	if c.BodyLimit <= 0 {
		c.BodyLimit = 8 << 20
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Minute
	}
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = time.Second
	}
	if c.StuckTimeout <= 0 {
		c.StuckTimeout = 30 * time.Second
	}
	if c.HoldKeepalive == 0 {
		c.HoldKeepalive = 5 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = time.Minute
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.FileLimit <= 0 {
		c.FileLimit = 200 << 20
	}
	if c.UploadsMax <= 0 {
		c.UploadsMax = 16
	}
	if c.UploadsPerTenant <= 0 {
		c.UploadsPerTenant = 4
	}
}

// Gateway is the HTTP server. Make one with New.
type Gateway struct {
	cfg Config
	cl  *client.Client
	cat Catalog
	nc  *nats.Conn
	log *slog.Logger
	app *fiber.App
	m   *metrics
	cor *cors // nil: CORS off

	// base is the parent of every request's context; Shutdown cancels it
	// (cause errShuttingDown) to cut whatever is still open at its deadline.
	base context.Context
	// errTimeout is the cause of a request that ran past RequestTimeout,
	// made once: every request's deadline carries it.
	errTimeout *schemas.Error
	cutBase    context.CancelCauseFunc

	draining atomic.Bool
	inflight tracker            // handlers and stream writers still running
	uploads  uploadGate         // uploads being read
	streams  *httpstream.Server // SSE responses on the app's connections
}

var errShuttingDown = schemas.ErrShuttingDown.New("gateway")

// New builds a gateway. reg may be nil (a fresh registry is used), nc may be
// nil (then /ready always says 503), log may be nil.
func New(cfg Config, cl *client.Client, cat Catalog, nc *nats.Conn, reg *prometheus.Registry, log *slog.Logger) *Gateway {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	g := &Gateway{cfg: cfg, cl: cl, cat: cat, nc: nc, log: log, m: newMetrics(reg), cor: newCORS(cfg.CORS),
		uploads: uploadGate{max: cfg.UploadsMax, each: cfg.UploadsPerTenant}}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tokenbus_gateway_uploads",
		Help: "File uploads being read now (bounded by --uploads-max, and per tenant by --uploads-per-tenant).",
	}, func() float64 { return float64(g.uploads.reading()) }))
	g.base, g.cutBase = context.WithCancelCause(context.Background())
	g.errTimeout = schemas.ErrRequestTimeout.New(cfg.RequestTimeout)
	g.app = fiber.New(fiber.Config{
		DisableStartupMessage: true,
		BodyLimit:             cfg.BodyLimit,
		ReadTimeout:           cfg.ReadTimeout,
		IdleTimeout:           cfg.IdleTimeout,
		// No WriteTimeout: streams last as long as generation does.
		ErrorHandler: g.errorHandler,
		AppName:      "tokenbus-gateway",
		// Bodies are streamed so that an upload is admitted before its body
		// is read (uploads.go); bufferBodies reads every other body first,
		// within BodyLimit, as fasthttp would.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
	})
	g.app.Server().HeaderReceived = g.uploadHook // FramingHook, and the upload's
	g.app.Server().Handler = g.bufferBodies(g.app.Server().Handler)
	RefuseUnknownMethods(g.app, func(ctx *fasthttp.RequestCtx, e *schemas.Error) {
		id := "req-" + nuid.Next()
		ctx.Response.Header.Set(fiber.HeaderXRequestID, id)
		g.m.requests.WithLabelValues(routeUnmatched, "", strconv.Itoa(e.Status)).Inc()
		g.logRequest(id, routeUnmatched, "", e.Status, 0, "-", outcomeOf(e), "")
	})
	// Streams are written on hijacked connections, which httpstream closes
	// or hands back to fasthttp itself.
	g.streams = httpstream.New(g.app.Server(), httpstream.Config{ProbeInterval: cfg.ProbeInterval, StuckTimeout: cfg.StuckTimeout})
	g.routes(reg)
	return g
}

// App is the Fiber application, for tests and for mounting extra routes.
func (g *Gateway) App() *fiber.App { return g.app }

func (g *Gateway) routes(reg *prometheus.Registry) {
	app := g.app
	app.Use(g.observe)
	app.Use(recover.New()) // a handler's panic becomes a 500, not a dead process
	app.Use(CheckFraming)  // smuggling shapes: 400, connection closed
	if g.cor != nil {
		app.Use(g.cor.handle) // every route, those added later included
	}
	for _, p := range []struct {
		prefix     string
		torchServe bool
	}{{"/v1", false}, {"/predictions/:model/:version/v1", true}} {
		app.Post(p.prefix+"/chat/completions", g.completions(schemas.KindChat, p.torchServe))
		app.Post(p.prefix+"/completions", g.completions(schemas.KindCompletion, p.torchServe))
		app.Post(p.prefix+"/embeddings", g.completions(schemas.KindEmbedding, p.torchServe))
		app.Get(p.prefix+"/models", g.listModels)
		app.Get(p.prefix+"/models/*", g.getModel)
	}
	app.Get("/version", g.version)
	// vLLM serves these at the root only, not under /v1.
	app.Post("/tokenize", g.completions(schemas.KindTokenize, false))
	app.Post("/detokenize", g.completions(schemas.KindDetokenize, false))
	if g.cfg.Batches != nil {
		g.filesRoutes(app)
	}
	g.responsesRoutes(app)
	app.Get("/health", g.health)
	app.Get("/ready", g.ready)
	// A gathering error panics before anything is written, so the recover
	// middleware and the error handler answer it in OpenAI's shape.
	var gather prometheus.Gatherer = reg
	if g.cfg.Metrics != nil {
		gather = g.cfg.Metrics
	}
	app.Get("/metrics", adaptor.HTTPHandler(promhttp.HandlerFor(gather, promhttp.HandlerOpts{ErrorHandling: promhttp.PanicOnError})))
}

// Serve serves HTTP on ln until Shutdown; it returns nil after Shutdown.
func (g *Gateway) Serve(ln net.Listener) error {
	if g.draining.Load() {
		return ln.Close()
	}
	err := g.app.Listener(ln)
	if g.draining.Load() {
		return nil
	}
	return err
}

// cutGrace bounds how long Shutdown waits, after cutting, for writers to
// notice and for their connections to close.
const cutGrace = 2 * time.Second

// Shutdown stops accepting connections, lets open requests finish until ctx
// ends (or ShutdownTimeout, if ctx has no deadline), then cuts the rest with a
// 503 shutting_down and cancels their work on the bus. It returns once every
// handler and stream writer has ended (bounded), with ctx's error if requests
// had to be cut.
func (g *Gateway) Shutdown(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.ShutdownTimeout)
		defer cancel()
	}
	g.draining.Store(true)
	g.streams.Drain()
	// fasthttp keeps its "stopping" flag only while ShutdownWithContext runs,
	// and that flag is what closes keep-alive connections after their
	// response; so it runs on its own context, past ctx, until the cut
	// requests have ended.
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	errc := make(chan error, 1)
	go func() { errc <- g.app.ShutdownWithContext(fctx) }()
	// fasthttp returns once no handler runs; streams write on hijacked
	// connections it no longer counts, so wait for those too, until ctx.
	var appErr error
	appDone := false
	select {
	case appErr = <-errc:
		appDone = true
		if g.inflight.wait(ctx) == nil {
			g.cutBase(errShuttingDown)
			return appErr
		}
	case <-ctx.Done():
	}
	g.log.Warn("shutdown grace over: cutting open requests", "open", g.inflight.count())
	g.cutBase(errShuttingDown)
	wctx, wcancel := context.WithTimeout(context.Background(), cutGrace)
	defer wcancel()
	_ = g.inflight.wait(wctx)
	if !appDone {
		select {
		case <-errc:
		case <-wctx.Done():
			fcancel()
			<-errc
		}
	}
	return ctx.Err()
}

// tracker counts running handlers and writers; wait returns when none is left.
type tracker struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func (t *tracker) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *tracker) wait(ctx context.Context) error {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return nil
	}
	if t.zero == nil {
		t.zero = make(chan struct{})
	}
	z := t.zero
	t.mu.Unlock()
	select {
	case <-z:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
