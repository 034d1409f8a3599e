package auth

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/gateway"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Config configures an Auth.
type Config struct {
	// Keys looks keys up; nil turns authentication off (Authorize then lets
	// everything through and usage is counted as registry.AnonymousKey).
	Keys    *registry.KeyCache
	Limiter *registry.Limiter // required: limits and usage
	Log     *slog.Logger
	Metrics prometheus.Registerer // may be nil
	// Timeout bounds each Redis call on a request's path, above the store's
	// breaker (registry.BreakerConfig.Timeout, which is what bounds them in
	// a gateway). Default 2s.
	Timeout time.Duration
	// MaxPendingUsage bounds usage writes in flight when usage is written
	// straight to Redis (Usage nil); past it usage is dropped (logged and
	// counted). Default 1024.
	MaxPendingUsage int

	// MaxTokens is a model's cap on what one completion may generate (its
	// registered max_model_len), reserved for requests that set no
	// max_tokens; nil, or 0 for a model, means DefaultMaxTokens.
	MaxTokens func(model string) int
	// DefaultMaxTokens is reserved for a request that sets no max_tokens of
	// a model with no known cap. Default 4096.
	DefaultMaxTokens int
	// FailClosed refuses requests of keys with limits (503
	// store_unavailable) when Redis cannot check them; by default they are
	// allowed (fail open).
	FailClosed bool
	// Usage, if set, takes every finished request's record (e.g. a
	// usage.Publisher, which makes it durable); nil writes it to Redis in
	// the background, bounded by MaxPendingUsage.
	Usage func(schemas.UsageRecord)
}

// Auth holds the hooks. Make one with New.
type Auth struct {
	cfg     Config
	log     *slog.Logger
	pending chan struct{} // a slot per usage write in flight

	decisions  *prometheus.CounterVec
	failOpen   prometheus.Counter
	failClosed prometheus.Counter
	usageLost  prometheus.Counter
}

// New makes an Auth.
func New(cfg Config) *Auth {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxPendingUsage <= 0 {
		cfg.MaxPendingUsage = 1024
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 4096
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Auth{cfg: cfg, log: log, pending: make(chan struct{}, cfg.MaxPendingUsage),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_auth_decisions_total",
			Help: "Completion requests by authorization outcome.",
		}, []string{"outcome"}),
		failOpen: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_auth_ratelimit_fail_open_total",
			Help: "Requests allowed without a rate-limit check because Redis did not answer.",
		}),
		failClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_auth_ratelimit_fail_closed_total",
			Help: "Requests refused (503) because Redis did not answer the rate-limit check and limits fail closed.",
		}),
		usageLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_auth_usage_lost_total",
			Help: "Finished requests whose usage could not be recorded (Redis error or too many writes pending).",
		}),
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(a.decisions, a.failOpen, a.failClosed, a.usageLost,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tokenbus_auth_usage_pending",
				Help: "Usage records waiting to be written to Redis (past MaxPendingUsage they are dropped and counted lost).",
			}, func() float64 { return float64(len(a.pending)) }))
	}
	return a
}

// Authorize is gateway.Config.Authorize.
func (a *Auth) Authorize(c *fiber.Ctx, req *schemas.Request) (gateway.Principal, error) {
	if a.cfg.Keys == nil {
		return gateway.Principal{}, nil
	}
	p, outcome, err := a.authorize(c, req)
	a.decisions.WithLabelValues(outcome).Inc()
	return p, err
}

func (a *Auth) authorize(c *fiber.Ctx, req *schemas.Request) (gateway.Principal, string, error) {
	model := req.Model
	secret, ok := bearer(c.Get(fiber.HeaderAuthorization))
	if !ok {
		return gateway.Principal{}, "missing_key", errMissingKey
	}
	if !strings.HasPrefix(secret, registry.SecretPrefix) {
		return gateway.Principal{}, "invalid_key", invalidKey(secret)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	k, err := a.cfg.Keys.Lookup(ctx, secret)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return gateway.Principal{}, "invalid_key", invalidKey(secret)
	case err != nil:
		a.log.Warn("API key lookup failed", "err", err)
		return gateway.Principal{}, "unavailable", err
	case !k.Allows(model):
		return gateway.Principal{}, "model_not_allowed", schemas.ErrModelNotAllowed.New(model)
	}
	d, outcome, aerr := a.admit(ctx, k, a.AdmissionOf(req))
	if d.RPM > 0 || d.TPM > 0 {
		setHeaders(c, d)
	}
	if aerr != nil {
		return gateway.Principal{}, outcome, aerr
	}
	return gateway.Principal{Tenant: k.Tenant, KeyID: k.ID, Reserved: d.Reserved, Window: d.Window}, outcome, nil
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

var errMissingKey = schemas.ErrMissingKey.New()

// invalidKey is OpenAI's 401 for a wrong key, which shows only the key's ends.
func invalidKey(secret string) *schemas.Error {
	shown := "***"
	if len(secret) >= 16 {
		shown = secret[:6] + "***" + secret[len(secret)-4:]
	}
	return schemas.ErrInvalidKey.New(shown)
}

// rateLimited is the 429 for a refused request.
func rateLimited(k registry.Key, d registry.Decision) *schemas.Error {
	what, limit, used := "requests per minute (RPM)", d.RPM, d.Requests
	if d.Exceeded == "tokens" {
		what, limit, used = "tokens per minute (TPM)", d.TPM, d.Tokens
	}
	return schemas.ErrRateLimited.New(k.ID, what, limit, used, resetString(d.Reset)).
		WithRetryAfter(int(math.Ceil(d.Reset.Seconds())))
}

// setHeaders sets OpenAI's x-ratelimit-* headers for the limits the key has.
func setHeaders(c *fiber.Ctx, d registry.Decision) {
	reset := resetString(d.Reset)
	if d.RPM > 0 {
		c.Set("x-ratelimit-limit-requests", strconv.Itoa(d.RPM))
		c.Set("x-ratelimit-remaining-requests", strconv.Itoa(d.RemainingRequests()))
		c.Set("x-ratelimit-reset-requests", reset)
	}
	if d.TPM > 0 {
		c.Set("x-ratelimit-limit-tokens", strconv.Itoa(d.TPM))
		c.Set("x-ratelimit-remaining-tokens", strconv.Itoa(d.RemainingTokens()))
		c.Set("x-ratelimit-reset-tokens", reset)
	}
}

// resetString formats a reset time as OpenAI does ("1s", "6m0s"), rounded up
// to the second.
func resetString(d time.Duration) string {
	return (time.Duration(math.Ceil(d.Seconds())) * time.Second).String()
}
