package registry

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// BreakerConfig tunes a Breaker. Zero values take the defaults shown.
type BreakerConfig struct {
	// Timeout bounds each Redis call on a request's path (key lookups, limit
	// checks, usage writes). Default 50ms: a healthy Redis answers in well
	// under a millisecond, and a request must not wait seconds on a dead one.
	Timeout time.Duration
	// Failures in a row (Redis unavailable, or slower than Timeout) open the
	// breaker. Default 5.
	Failures int
	// Cooldown is how long it stays open before one call probes Redis
	// (half-open): success closes it, failure opens it again. Default 1s.
	Cooldown time.Duration
	// OnChange, if set, is told of every transition (for metrics and logs).
	// It is called with the breaker's lock held: it must not call back.
	OnChange func(from, to BreakerState)
}

// BreakerState is a breaker's state.
type BreakerState int

// The states, in the order of the tokenbus_redis_breaker_state gauge.
const (
	BreakerClosed   BreakerState = iota // calls go to Redis
	BreakerHalfOpen                     // one probe call goes to Redis, the others fail at once
	BreakerOpen                         // calls fail at once with ErrUnavailable
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}

// Breaker is a circuit breaker on Redis: each call gets a bounded wait, and
// after Failures unavailable calls in a row every call fails at once for a
// Cooldown, so a stopped Redis costs requests milliseconds, not seconds.
// Only ErrUnavailable counts as a failure: a key that is not found is an
// answer. Its methods are safe for concurrent use; a nil *Breaker only
// bounds nothing and passes every call through.
type Breaker struct {
	cfg BreakerConfig

	mu       sync.Mutex
	state    BreakerState
	fails    int
	openedAt time.Time
	probing  bool // a half-open probe is out
}

// errBreakerOpen is the cause of a call the open breaker refused.
var errBreakerOpen = errors.New("redis circuit breaker open")

// NewBreaker makes a closed breaker.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 50 * time.Millisecond
	}
	if cfg.Failures <= 0 {
		cfg.Failures = 5
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = time.Second
	}
	return &Breaker{cfg: cfg}
}

// State is the breaker's state now.
func (b *Breaker) State() BreakerState {
	if b == nil {
		return BreakerClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Timeout is the bound of each call.
func (b *Breaker) Timeout() time.Duration {
	if b == nil {
		return 0
	}
	return b.cfg.Timeout
}

// Do runs f with ctx bounded by Timeout, unless the breaker is open; then
// it returns ErrUnavailable at once. f's error is returned as it is.
func (b *Breaker) Do(ctx context.Context, f func(context.Context) error) error {
	if b == nil {
		return f(ctx)
	}
	probe, ok := b.allow()
	if !ok {
		return &regError{sentinel: ErrUnavailable, cause: errBreakerOpen, api: schemas.ErrStoreUnavailable.New()}
	}
	cctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	err := f(cctx)
	cancel()
	// The caller's own end is not Redis's fault.
	failed := err != nil && errors.Is(err, ErrUnavailable) && ctx.Err() == nil
	b.done(probe, failed, err != nil && ctx.Err() != nil)
	return err
}

// allow says whether a call may go to Redis, and whether it is the probe.
func (b *Breaker) allow() (probe, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerOpen:
		if time.Since(b.openedAt) < b.cfg.Cooldown {
			return false, false
		}
		b.set(BreakerHalfOpen)
		b.probing = true
		return true, true
	case BreakerHalfOpen:
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
	return false, true
}

// done counts a call's outcome; aborted: the caller gave up, which says
// nothing of Redis (a probe that was aborted lets the next call probe).
func (b *Breaker) done(probe, failed, aborted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case aborted:
	case failed:
		b.fails++
		if probe || b.state == BreakerClosed && b.fails >= b.cfg.Failures {
			b.openedAt = time.Now()
			b.set(BreakerOpen)
		}
	default:
		b.fails = 0
		if b.state != BreakerClosed {
			b.set(BreakerClosed)
		}
	}
}

func (b *Breaker) set(to BreakerState) {
	from := b.state
	b.state = to
	if b.cfg.OnChange != nil && from != to {
		b.cfg.OnChange(from, to)
	}
}
