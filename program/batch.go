package program

import (
	"context"
	"errors"
	"log/slog"
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
	// UploadsMax and UploadsPerTenant bound the uploads a gateway reads at
	// once, in all and of one tenant (defaults 16 and 4).
	UploadsMax, UploadsPerTenant int
	// The most each JetStream surface of the batch store holds, in bytes
	// (batch.Config): the files bucket, the work queue, the results stream,
	// the batches and the index bucket.
	FilesMaxBytes, QueueMaxBytes, ResultsMaxBytes, RecordsMaxBytes int64
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
	return BatchConfig{Enabled: true, Runner: true, FileLimit: 200 << 20, UploadsMax: 16, UploadsPerTenant: 4,
		FilesMaxBytes: 1 << 30, QueueMaxBytes: 512 << 20, ResultsMaxBytes: 512 << 20, RecordsMaxBytes: 64 << 20,
		MaxLines: 50_000, MaxInFlight: 64, MaxPerBatch: 32,
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
		MaxLineBytes: int(gw.nc.MaxPayload()) - 16<<10, FilesMaxBytes: cfg.FilesMaxBytes, WorkMaxBytes: cfg.QueueMaxBytes,
		ResultsMaxBytes: cfg.ResultsMaxBytes, RecordsMaxBytes: cfg.RecordsMaxBytes, Quotas: batchQuotas(gw.quotas)})
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
	if err := s.IndexErr(); err != nil {
		gw.log.Warn("files and batches have no per-tenant index: every listing and quota count reads every tenant's files "+
			"(the gateway's NATS user needs the Key-Value bucket TOKENBUS_INDEX: docs/batch.md)", "err", err)
	} else {
		gw.part("batch index", func() error { reconcile(gw.ctx, s, gw.log); return nil })
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

// batchQuotas is the batch store's view of the tenants' quotas.
func batchQuotas(c *registry.QuotaCache) func(ctx context.Context, tenant string) (batch.Quota, error) {
	return func(ctx context.Context, tenant string) (batch.Quota, error) {
		q, err := c.Lookup(ctx, tenant)
		return batch.Quota{FileBytes: q.FileBytes, Files: q.Files, Batches: q.Batches}, err
	}
}

// reconcile brings the batch store's per-tenant index up to date with its
// files and batches (an older deployment has none yet; a process that died
// between a file and its entry left one out), retrying until it has, then
// waits for the program's end.
func reconcile(ctx context.Context, s *batch.Store, log *slog.Logger) {
	for wait := time.Second; ctx.Err() == nil; wait = min(2*wait, time.Minute) {
		start := time.Now()
		added, removed, err := s.Reconcile(ctx)
		if err == nil {
			if added+removed > 0 {
				log.Info("batch index reconciled", "added", added, "removed", removed, "took", time.Since(start).Round(time.Millisecond))
			}
			break
		}
		log.Warn("batch index: could not reconcile; listings scan meanwhile", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	<-ctx.Done()
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
		if capacity == 0 {
			// No worker serves the model: its requests are held until one
			// starts, wakes or switches (docs/capacity.md), and only a
			// request that waits makes that happen. A line per poll (4 a
			// second, up to the runner's in-flight bound) makes the demand
			// show without pouring the whole batch into the queue.
			return 1
		}
		return free - int(math.Ceil(headroom*float64(capacity)))
	}
}
