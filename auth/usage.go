package auth

import (
	"context"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// OnUsage is gateway.Config.OnUsage: it hands the record to Config.Usage,
// or, without one, records it in the background (it must not hold up the
// response), bounded by MaxPendingUsage.
func (a *Auth) OnUsage(rec schemas.UsageRecord) {
	if a.cfg.Usage != nil {
		a.cfg.Usage(rec)
		return
	}
	select {
	case a.pending <- struct{}{}:
	default:
		a.usageLost.Inc()
		a.log.Warn("usage dropped: too many usage writes pending", "key_id", rec.KeyID, "model", rec.Model)
		return
	}
	go func() {
		defer func() { <-a.pending }()
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Timeout)
		defer cancel()
		if _, err := a.cfg.Limiter.Record(ctx, rec); err != nil {
			a.usageLost.Inc()
			a.log.Warn("usage not recorded", "key_id", rec.KeyID, "model", rec.Model, "err", err)
		}
	}()
}

// Wait waits until the usage writes in flight are done, or ctx ends.
func (a *Auth) Wait(ctx context.Context) error {
	// The slots, not a WaitGroup: usage writes start while others are waited
	// for, which a WaitGroup does not allow.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for len(a.pending) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
