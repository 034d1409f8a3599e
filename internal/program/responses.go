package program

import (
	"context"
	"time"

	"github.com/tokenbus/tokenbus/responses"
)

// startResponses opens the responses store and starts the background
// runner as a part of the gateway. Like batches, it needs JetStream;
// without it /v1/responses still answers, with neither store nor
// background.
func (gw *gatewayRun) startResponses(ctx context.Context) (*responses.Store, error) {
	cfg := gw.cfg.HTTP.Batch // the same switch and replicas as batches: both are JetStream state
	if !cfg.Enabled {
		return nil, nil
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	before := gw.nc.LastError()
	s, err := responses.Open(octx, gw.nc, responses.Config{Replicas: cfg.Replicas, Retention: cfg.ResponseRetention})
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
	rcfg := responses.RunnerConfig{AckWait: cfg.ResponseAckWait, RequestTimeout: gw.cfg.HTTP.RequestTimeout,
		Log: componentLog(gw.cfg.Log, "responses")}
	if gw.au != nil {
		rcfg.OnUsage = gw.au.OnUsage
	}
	r := responses.NewRunner(s, gw.cl, rcfg)
	gw.part("responses runner", func() error { return r.Run(gw.ctx) })
	return s, nil
}
