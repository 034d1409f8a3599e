package auth

import (
	"context"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// AdmissionOf is what req asks of its key's limits: its prompts as
// requests, and its prompt estimate plus the most it may generate as
// tokens (registry.AdmissionOf), the model's cap standing in for an absent
// max_tokens.
func (a *Auth) AdmissionOf(req *schemas.Request) registry.Admission {
	return registry.AdmissionOf(req, a.maxTokens(req.Model))
}

func (a *Auth) maxTokens(model string) int {
	if a.cfg.MaxTokens != nil {
		if n := a.cfg.MaxTokens(model); n > 0 {
			return n
		}
	}
	return a.cfg.DefaultMaxTokens
}

// Admit checks key k's limits for one request and reserves its tokens, for
// any front end (the HTTP gateway through Authorize, a dispatcher for
// NATS-native requests). The decision's Reserved and Window go into the
// request's UsageRecord. The error is a 429 rate_limit_exceeded with
// Retry-After, or, with FailClosed, a 503 store_unavailable when Redis
// cannot say; by default a Redis failure allows the request, reserving
// nothing (the decision then has no limits to report).
func (a *Auth) Admit(ctx context.Context, k registry.Key, req registry.Admission) (registry.Decision, *schemas.Error) {
	d, outcome, err := a.admit(ctx, k, req)
	a.decisions.WithLabelValues(outcome).Inc()
	return d, err
}

// admit is Admit without counting the outcome (Authorize counts its own).
func (a *Auth) admit(ctx context.Context, k registry.Key, req registry.Admission) (registry.Decision, string, *schemas.Error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	d, err := a.cfg.Limiter.Admit(ctx, k, req)
	switch {
	case err != nil && a.cfg.FailClosed:
		a.failClosed.Inc()
		a.log.Warn("rate-limit check failed: refusing the request (fail closed)", "key_id", k.ID, "err", err)
		return registry.Decision{}, "fail_closed", schemas.ErrStoreUnavailable.New()
	case err != nil:
		a.failOpen.Inc()
		a.log.Warn("rate-limit check failed: allowing the request (fail open)", "key_id", k.ID, "err", err)
		return registry.Decision{Allowed: true}, "fail_open", nil
	case !d.Allowed:
		return d, "rate_limited", rateLimited(k, d)
	}
	return d, "ok", nil
}

// Readmit lets a request its client sends again after its worker failed in
// on its first admission (registry.Limiter.Readmit): ok false means it was
// not found there (or not reachable: Admit then decides, failing open or
// closed as configured), and the request is admitted as a new one.
func (a *Auth) Readmit(ctx context.Context, k registry.Key, requestID string) (registry.Decision, bool) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	d, ok, err := a.cfg.Limiter.Readmit(ctx, k, requestID)
	if err != nil || !ok {
		return registry.Decision{}, false
	}
	a.decisions.WithLabelValues("readmitted").Inc()
	return d, true
}
