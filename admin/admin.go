package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/gateway"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Config configures the admin API. Token, Store, NC and Fleet are required.
type Config struct {
	Token string          // the admin bearer token
	Store *registry.Store // models, adapters, keys, usage
	NC    *nats.Conn      // events and worker control
	Fleet fleet.View      // the live workers
	// StoreTimeout bounds each Redis call. Default 5s.
	StoreTimeout time.Duration
	// CtlTimeout bounds each control request to a worker (drain, unload).
	// Default 10s.
	CtlTimeout time.Duration
	Log        *slog.Logger
	// Redactor cleans what error bodies quote of a request; nil: one that
	// knows Token.
	Redactor *gateway.Redactor
	// Throttle backs off wrong tokens per client address (gateway/throttle.go);
	// nil: no throttle. TrustedProxies: whose X-Forwarded-For is believed.
	Throttle       *gateway.Throttle
	TrustedProxies []netip.Prefix
	// Batches, if set, lists every tenant's batches (GET /batches) and what
	// each tenant keeps in files and batches (GET /tenants).
	Batches *batch.Store
	// Quotas is the gateway's quota cache: its defaults are shown, and a
	// change made here is applied to it at once (nil: defaults none).
	Quotas *registry.QuotaCache

	// The console (/console/): APIAddr is the OpenAI API's listen address
	// (the playground calls it from the browser), APIAuth whether it needs
	// API keys, Metrics the process's registry the traffic events read.
	APIAddr string
	APIAuth bool
	Metrics prometheus.Gatherer
}

// Server is the admin HTTP server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	app   *fiber.App
	token [sha256.Size]byte
	// base ends at Shutdown: it bounds what outlives a handler (file
	// bodies, the traffic stream).
	base    context.Context
	endBase context.CancelFunc
	streams chan struct{} // traffic streams open, bounded
}

// New builds the admin server.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Token == "":
		return nil, errors.New("admin: an admin token is required")
	case cfg.Store == nil || cfg.NC == nil || cfg.Fleet == nil:
		return nil, errors.New("admin: Store, NC and Fleet are required")
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = 5 * time.Second
	}
	if cfg.CtlTimeout <= 0 {
		cfg.CtlTimeout = 10 * time.Second
	}
	if cfg.Redactor == nil {
		cfg.Redactor = gateway.NewRedactor(cfg.Token)
	}
	cfg.Throttle.Reasons("wrong_admin_token")
	s := &Server{cfg: cfg, log: cfg.Log, token: sha256.Sum256([]byte(cfg.Token)), streams: make(chan struct{}, maxTrafficStreams)}
	s.base, s.endBase = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.app = fiber.New(fiber.Config{
		DisableStartupMessage: true,
		BodyLimit:             bodyLimit,
		ReadTimeout:           time.Minute,
		IdleTimeout:           2 * time.Minute,
		ErrorHandler:          s.errorHandler,
		AppName:               "tokenbus-admin",
	})
	gateway.GuardFraming(s.app)
	gateway.RefuseUnknownMethods(s.app, nil)
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	app := s.app
	app.Use(recover.New())
	app.Use(gateway.CheckFraming) // smuggling shapes: 400, connection closed
	// The console's files before the token check: the page holds no data,
	// it asks for the token and sends it with every call below.
	s.consoleRoutes()
	app.Use(s.authenticate)
	app.Get("/console/config", s.consoleConfig)
	app.Get("/events/traffic", s.traffic)
	app.Get("/models", s.listModels)
	app.Post("/models", s.putModel)
	app.Get("/models/*", s.getModel)
	app.Delete("/models/*", s.deleteModel)
	app.Post("/adapters", s.putAdapter)
	app.Delete("/adapters/*", s.deleteAdapter)
	app.Get("/workers", s.listWorkers)
	app.Post("/workers/:id/drain", s.drainWorker)
	app.Get("/workers/switches", s.listSwitches)
	app.Post("/workers/:id/switch", s.switchWorker)
	app.Post("/keys", s.createKey)
	app.Get("/keys", s.listKeys)
	app.Delete("/keys/:id", s.deleteKey)
	app.Patch("/keys/:id", s.patchKey)
	app.Get("/usage", s.usage)
	app.Get("/tenants", s.listTenants)
	app.Get("/tenants/:tenant/quotas", s.getTenantQuotas)
	app.Put("/tenants/:tenant/quotas", s.putTenantQuotas)
	app.Get("/batches", s.listBatches)
	app.Post("/batches/:id/cancel", s.cancelBatch)
	app.Get("/batches/:id/output", s.batchOutput)
	app.Get("/batches/:id/errors", s.batchErrors)
}

// App is the Fiber application, for tests.
func (s *Server) App() *fiber.App { return s.app }

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.app.Listener(ln) }

// Shutdown stops the server, letting open requests finish until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.endBase() // traffic streams end, so that open connections can close
	return s.app.ShutdownWithContext(ctx)
}

// authenticate checks the admin token in constant time (comparing hashes, so
// not even the token's length leaks). A client address with too many wrong
// tokens gets 429 without its token being checked: the token is chosen by a
// person and may be weak, so a blocked guesser must learn nothing.
func (s *Server) authenticate(c *fiber.Ctx) error {
	addr := gateway.AddrKey(gateway.ClientAddr(c, s.cfg.TrustedProxies))
	if d := s.cfg.Throttle.Blocked(addr); d > 0 {
		s.cfg.Throttle.Refused()
		return gateway.ThrottledError(d)
	}
	h := c.Get(fiber.HeaderAuthorization)
	scheme, token, _ := strings.Cut(h, " ")
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], s.token[:]) != 1 {
		if strings.TrimSpace(h) != "" { // a missing token is no guess
			s.cfg.Throttle.Fail("wrong_admin_token", addr)
		}
		c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="tokenbus-admin"`)
		return errBadToken
	}
	return c.Next()
}

var errBadToken = schemas.ErrBadAdminToken.New()

// bodyLimit is the largest admin API body: models, adapters and keys are small.
const bodyLimit = 1 << 20

// errorHandler writes every error in OpenAI's shape.
func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	e := s.cfg.Redactor.Error(gateway.APIError(c, err, bodyLimit))
	if e.Status >= 500 {
		// The route pattern, not the path (client text); e, not err (a
		// fasthttp error quotes the raw request).
		s.log.Warn("admin request failed", "method", gateway.LogMethod(c.Method()), "route", c.Route().Path, "status", e.Status, "err", e.Body.Message)
	}
	return gateway.WriteError(c, e)
}

// ctx is the context of one Redis call.
func (s *Server) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
}

// decode reads a JSON object body into dst, strictly: unknown fields and
// trailing data are 400s, so typos do not pass silently.
func decode(c *fiber.Ctx, dst any) error {
	body := bytes.TrimSpace(c.Body())
	if len(body) == 0 {
		return schemas.ErrBodyEmpty.New()
	}
	if body[0] != '{' {
		return schemas.ErrBodyNotObject.New()
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return schemas.ErrInvalidType.At(te.Field, te.Field, te.Type.String(), "a JSON "+te.Value)
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			f = strings.Trim(f, `"`)
			return schemas.ErrUnknownParam.At(f, f)
		}
		return schemas.ErrBodyNotJSON.New(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return schemas.ErrBodyTrailing.New()
	}
	return nil
}

// pathParam is a route parameter, unescaped and copied out of fasthttp's buffers.
func pathParam(c *fiber.Ctx, name string) string {
	v := c.Params(name)
	if u, err := url.PathUnescape(v); err == nil {
		v = u
	}
	return strings.Clone(v)
}

// list is OpenAI's list object.
type list[T any] struct {
	Object string `json:"object"`
	Data   []T    `json:"data"`
}

func newList[T any](data []T) list[T] {
	if data == nil {
		data = []T{}
	}
	return list[T]{Object: "list", Data: data}
}
