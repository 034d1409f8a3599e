package program

import (
	"context"
	"time"

	"github.com/tokenbus/tokenbus/responses"
)

// ResponsesConfig bounds a gateway's Responses API state and runner
// (docs/responses.md, "Limits"). Its switch, replicas, retention and ack
// wait are the batches' (BatchConfig): both are JetStream state.
type ResponsesConfig struct {
	// RecordBytes and EventBytes bound the JetStream bucket of records and
	// the stream of events (full: new ones are refused, 503).
	RecordBytes, EventBytes int64
	// MaxFollows and MaxFollowsPerTenant bound the follows (streamed
	// background responses, resumable streams) this gateway serves at once
	// (past them 503 / 429), each one JetStream consumer.
	MaxFollows, MaxFollowsPerTenant int
	// RunnerSlots and RunnerTenantSlots: background responses and
	// resumable streams this gateway's runner generates at once, in all
	// and of one tenant.
	RunnerSlots, RunnerTenantSlots int
	// RunnerMaxAttempts: failed runs of one response (JetStream refusing,
	// runners dying) before it ends failed, in band.
	RunnerMaxAttempts int
	// Quota is every tenant's (0: no limit), unless QuotaFunc is set.
	Quota responses.Quota
	// QuotaFunc, if set, gives a tenant's quota (e.g. per-tenant records in
	// Redis); it may fall back to Quota.
	QuotaFunc func(ctx context.Context, tenant string) (responses.Quota, error)
	// KeyRevoked, if set, says whether an API key was deleted: that key's
	// queued and running background responses and resumable streams end
	// failed. nil: never.
	KeyRevoked func(ctx context.Context, keyID string) bool
}

// DefaultResponses is ResponsesConfig as `tokenbus gateway` has it.
func DefaultResponses() ResponsesConfig {
	return ResponsesConfig{RecordBytes: 512 << 20, EventBytes: 512 << 20, MaxFollows: 1024, MaxFollowsPerTenant: 256,
		RunnerSlots: 64, RunnerTenantSlots: 16, RunnerMaxAttempts: 20,
		Quota: responses.Quota{Stored: 10_000, Background: 256, Resumable: 256}}
}

// startResponses opens the responses store and starts the background
// runner as a part of the gateway. Like batches, it needs JetStream;
// without it /v1/responses still answers, with neither store nor
// background.
func (gw *gatewayRun) startResponses(ctx context.Context) (*responses.Store, error) {
	cfg := gw.cfg.HTTP.Batch // the same switch and replicas as batches: both are JetStream state
	if !cfg.Enabled {
		return nil, nil
	}
	rc := gw.cfg.HTTP.Responses
	quota := rc.QuotaFunc
	if quota == nil && gw.quotas != nil {
		// Each tenant's own (the admin API's), else the flags'.
		quota = func(ctx context.Context, tenant string) (responses.Quota, error) {
			q, err := gw.quotas.Lookup(ctx, tenant)
			return responses.Quota{Stored: int(q.StoredResponses), Background: int(q.Background), Resumable: int(q.Resumable)}, err
		}
	}
	if quota == nil {
		quota = responses.FixedQuota(rc.Quota)
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	before := gw.nc.LastError()
	s, err := responses.Open(octx, gw.nc, responses.Config{Replicas: cfg.Replicas, Retention: cfg.ResponseRetention,
		RecordBytes: rc.RecordBytes, EventBytes: rc.EventBytes, MaxFollows: rc.MaxFollows,
		MaxFollowsPerTenant: rc.MaxFollowsPerTenant, Quota: quota})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		gw.featureOff("stored and background responses", before, err)
		return nil, nil
	}
	if !cfg.Runner {
		return s, nil
	}
	rcfg := responses.RunnerConfig{MaxInFlight: rc.RunnerSlots, PerTenant: rc.RunnerTenantSlots, MaxAttempts: rc.RunnerMaxAttempts, AckWait: cfg.ResponseAckWait,
		RequestTimeout: gw.cfg.HTTP.RequestTimeout, KeyRevoked: rc.KeyRevoked, Log: componentLog(gw.cfg.Log, "responses")}
	if rcfg.KeyRevoked == nil && gw.revoked != nil && gw.cfg.HTTP.Auth {
		// A deleted key's queued and running responses end failed.
		rcfg.KeyRevoked = gw.revoked.Revoked
	}
	if gw.au != nil {
		rcfg.OnUsage = gw.au.OnUsage
	}
	r := responses.NewRunner(s, gw.cl, rcfg)
	gw.part("responses runner", func() error { return r.Run(gw.ctx) })
	return s, nil
}
