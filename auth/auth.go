package auth

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/netip"
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
	// Throttle backs off failed key checks per client address and key
	// prefix (gateway/throttle.go); nil: no throttle.
	Throttle *gateway.Throttle
	// TrustedProxies are the peers whose X-Forwarded-For names the client
	// address; for anyone else it is the TCP peer.
	TrustedProxies []netip.Prefix
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
	cfg.Throttle.Reasons("malformed_key", "unknown_key")
	// Each outcome has its series from start-up, at 0.
	for _, o := range []string{"ok", "missing_key", "invalid_key", "throttled", "unavailable", "model_not_allowed",
		"rate_limited", "readmitted", "fail_open", "fail_closed"} {
		a.decisions.WithLabelValues(o)
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
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	k, outcome, err := a.checkKey(ctx, c)
	switch {
	case err != nil:
		return gateway.Principal{}, outcome, err
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
	return gateway.Principal{Tenant: k.Tenant, KeyID: k.ID, Reserved: d.Reserved, Window: d.Window,
		Band: k.FlowBand(), Weight: k.Weight, MaxQueue: time.Duration(k.MaxQueueMS) * time.Millisecond}, outcome, nil
}

// ModelAccess is gateway.Config.ModelAccess: GET /v1/models needs a key
// (with the same throttle as every key check) and lists what the key may
// use. No rate limit applies.
func (a *Auth) ModelAccess(c *fiber.Ctx) (func(model string) bool, error) {
	if a.cfg.Keys == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	k, _, err := a.checkKey(ctx, c)
	if err != nil {
		return nil, err
	}
	return k.Allows, nil
}

// Identify is gateway.Config.Identify: the Files and Batches APIs need a
// key (with the same throttle as every key check); files and batches
// belong to its tenant. No rate limit applies here: a batch's lines are
// counted as they run.
func (a *Auth) Identify(c *fiber.Ctx) (gateway.Principal, error) {
	if a.cfg.Keys == nil {
		return gateway.Principal{}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
	defer cancel()
	k, _, err := a.checkKey(ctx, c)
	if err != nil {
		return gateway.Principal{}, err
	}
	return gateway.Principal{Tenant: k.Tenant, KeyID: k.ID}, nil
}

// throttledKeyAge is how old a cached key may be and still be accepted from
// a throttled address or prefix (see gateway/throttle.go). Deleted keys leave the
// cache at once through the keys event; this bounds a lost event.
const throttledKeyAge = 5 * time.Minute

// checkKey is the key check: the request's bearer key, looked up by its
// hash, with failed checks counted by the throttle and blocked clients
// refused before any lookup. outcome labels tokenbus_auth_decisions_total.
func (a *Auth) checkKey(ctx context.Context, c *fiber.Ctx) (registry.Key, string, error) {
	secret, ok := bearer(c.Get(fiber.HeaderAuthorization))
	if !ok {
		return registry.Key{}, "missing_key", errMissingKey // no guess: not counted
	}
	addr := gateway.AddrKey(gateway.ClientAddr(c, a.cfg.TrustedProxies))
	prefix := gateway.PrefixKey(secret, registry.SecretPrefix)
	if d := a.cfg.Throttle.Blocked(addr); d > 0 {
		if k, ok := a.cfg.Keys.Peek(secret, throttledKeyAge); ok {
			return k, "", nil
		}
		a.cfg.Throttle.Refused()
		return registry.Key{}, "throttled", gateway.ThrottledError(d)
	}
	// A blocked prefix still lets a real key through (it is looked up):
	// otherwise whoever knows a key's first characters could lock its
	// holder out. A miss is a 429, so guessing under that prefix stays slow
	// to read (Retry-After) and counted, and each miss still counts against
	// the address, which is what bounds one guesser.
	prefixBlock := a.cfg.Throttle.Blocked(prefix)
	if !strings.HasPrefix(secret, registry.SecretPrefix) {
		a.cfg.Throttle.Fail("malformed_key", addr)
		return registry.Key{}, "invalid_key", invalidKey(secret)
	}
	k, err := a.cfg.Keys.Lookup(ctx, secret)
	switch {
	case errors.Is(err, registry.ErrNotFound) && prefixBlock > 0:
		a.cfg.Throttle.Fail("unknown_key", addr, prefix)
		a.cfg.Throttle.Refused()
		return registry.Key{}, "throttled", gateway.ThrottledError(prefixBlock)
	case errors.Is(err, registry.ErrNotFound):
		a.cfg.Throttle.Fail("unknown_key", addr, prefix)
		return registry.Key{}, "invalid_key", invalidKey(secret)
	case err != nil:
		a.log.Warn("API key lookup failed", "err", err)
		return registry.Key{}, "unavailable", err
	}
	return k, "", nil
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
