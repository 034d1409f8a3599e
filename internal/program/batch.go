package program

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/registry"
)

// BatchConfig is a gateway's Files and Batches APIs and its batch runner.
type BatchConfig struct {
	// Enabled serves the Files and Batches APIs (and runs the runner, if
	// Runner); off, neither.
	Enabled bool
	// Runner runs batches in this process (validates them, sends their
	// lines through the bus, writes their output files). Any number of
	// gateways may run one; the API works without.
	Runner bool
	// FileLimit bounds one uploaded file in bytes (default 200 MiB).
	FileLimit int64
	// MaxLines bounds a batch's input file (default 50000, OpenAI's).
	MaxLines int
	// MaxInFlight and MaxPerBatch bound the lines this runner runs at once,
	// in all and of one batch.
	MaxInFlight, MaxPerBatch int
	// Priority is the Tb-Priority of batch lines (lower first; interactive
	// requests have 0).
	Priority int
	// AckWait: a line taken by a runner that died runs again after it.
	AckWait time.Duration
	// Replicas of the batch streams and buckets (3 on a NATS cluster).
	Replicas int
	// Headroom is the share of a model's slots (its workers' admission
	// caps) batch lines leave free for interactive requests, so that one
	// arriving finds a slot at once rather than wait for a line to end.
	Headroom float64
	// ResponseRetention: stored responses and their events are kept this
	// long (default 30 days). ResponseAckWait: a background response whose
	// runner died is continued by another after it (default 30s).
	ResponseRetention, ResponseAckWait time.Duration
}

// DefaultBatch is BatchConfig as `tokenbus gateway` and `tokenbus dev` have it.
func DefaultBatch() BatchConfig {
	return BatchConfig{Enabled: true, Runner: true, FileLimit: 200 << 20, MaxLines: 50_000, MaxInFlight: 64, MaxPerBatch: 32,
		Priority: 100, AckWait: 30 * time.Second, Replicas: 1, Headroom: 0.125,
		ResponseRetention: 30 * 24 * time.Hour, ResponseAckWait: 30 * time.Second}
}

// startBatch opens the batch store and starts the runner as a part of the
// gateway. The store needs JetStream; without it the APIs stay off (and
// say why in the log) rather than fail the gateway.
func (gw *gatewayRun) startBatch(ctx context.Context, workers *fleet.Fleet, store *registry.Store, reg prometheus.Registerer) (*batch.Store, error) {
	cfg := gw.cfg.HTTP.Batch
	if !cfg.Enabled {
		return nil, nil
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	before := gw.nc.LastError()
	s, err := batch.Open(octx, gw.nc, batch.Config{Replicas: cfg.Replicas, MaxLines: cfg.MaxLines,
		MaxLineBytes: int(gw.nc.MaxPayload()) - 16<<10})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		gw.featureOff("files and batches", before, err)
		return nil, nil
	}
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tokenbus_batch_lines_queued",
			Help: "Lines of every batch waiting in the JetStream work queue TOKENBUS_BATCH (not yet answered); -1 when JetStream did not say.",
		}, func() float64 {
			qctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			n, err := s.Queued(qctx)
			if err != nil {
				return -1
			}
			return float64(n)
		}))
	}
	if !cfg.Runner {
		return s, nil
	}
	rcfg := batch.RunnerConfig{MaxInFlight: cfg.MaxInFlight, MaxPerBatch: cfg.MaxPerBatch, Priority: cfg.Priority,
		RequestTimeout: gw.cfg.HTTP.RequestTimeout, AckWait: cfg.AckWait, Log: componentLog(gw.cfg.Log, "batch"),
		Metrics: reg, Capacity: freeSlots(workers, cfg.Headroom)}
	if gw.au != nil {
		rcfg.OnUsage = gw.au.OnUsage
	}
	if store != nil && gw.cfg.HTTP.Auth {
		rcfg.ModelAllowed = func(ctx context.Context, keyID, model string) (bool, error) {
			k, err := store.Key(ctx, keyID)
			if errors.Is(err, registry.ErrNotFound) {
				return false, nil // the key is gone: its batch runs nothing
			}
			return err == nil && k.Allows(model), err
		}
		// A deleted key's lines stop before they start (and its batches
		// end cancelled).
		rcfg.KeyRevoked = gw.revoked.Revoked
	}
	r := batch.NewRunner(s, gw.cl, rcfg)
	gw.part("batch runner", func() error { return r.Run(gw.ctx) })
	return s, nil
}

// freeSlots is the runner's capacity check: the free slots of the live,
// healthy, non-draining workers serving a model (their cap less their load,
// as the fleet estimates it), less headroom of their caps, so that batch
// lines take only what is idle and leave room for interactive requests.
func freeSlots(workers *fleet.Fleet, headroom float64) func(model string) int {
	return func(model string) int {
		free, capacity := 0, 0
		for _, w := range workers.Workers() {
			if w.Draining || !w.Healthy || !slices.Contains(w.Models, model) {
				continue
			}
			capacity += w.MaxConcurrency
			free += max(0, w.MaxConcurrency-w.Load)
		}
		return free - int(math.Ceil(headroom*float64(capacity)))
	}
}
