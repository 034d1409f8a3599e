package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// RunnerConfig tunes a Runner. Zero values take the defaults shown.
type RunnerConfig struct {
	ID          string // names this runner in leases; default a random one
	MaxInFlight int    // lines running at once in this runner; default 64
	MaxPerBatch int    // lines of one batch running at once in this runner; default 32
	// Every line goes in the batch band, below every interactive request
	// (docs/scheduling.md). Priority is every line's Tb-Priority, which
	// orders only the tenant's own queued requests: lower first; the
	// tenant's interactive requests have 0. Default 100.
	Priority int
	// RequestTimeout bounds one line end to end; default 10m.
	RequestTimeout time.Duration
	// AckWait: a line taken by a runner that died runs again after it.
	// Runners extend it while a line runs. Default 30s.
	AckWait time.Duration
	// MaxAttempts bounds how often a line whose request failed for want of
	// capacity (503: no worker, bus down, shutting down) is run again
	// before it is answered with that error. Default 20.
	MaxAttempts int
	// Capacity, if set, says how many more requests model's workers take
	// now (their free slots). A line starts only while it is positive, so
	// batch work fills what interactive traffic leaves and never queues
	// in front of it. nil: no such check (MaxInFlight alone bounds it).
	Capacity func(model string) int
	// ModelAllowed, if set, says whether the API key keyID may use model;
	// a batch naming a model its key may not use fails validation.
	ModelAllowed func(ctx context.Context, keyID, model string) (bool, error)
	// KeyRevoked, if set, says whether the API key keyID has been deleted
	// (registry.Revocations.Revoked). It is asked before each line starts and
	// before validation, so it must be cheap (cached): a revoked key's
	// lines are answered key_revoked without running, and its batch is
	// cancelled.
	KeyRevoked func(ctx context.Context, keyID string) bool
	// ValidationTimeout bounds one validation of a batch's input file
	// (reading and checking every line, then queueing them); past it the
	// batch fails with validation_timeout. Default 90s.
	ValidationTimeout time.Duration
	// OnUsage, if set, gets the usage of every line that ran, so that limits
	// and usage accounting count batch tokens. It must not block.
	OnUsage func(rec schemas.UsageRecord)
	Poll    time.Duration // how often batches are looked at with nothing else to wake the runner; default 250ms
	Log     *slog.Logger
	Metrics prometheus.Registerer // may be nil
}

func (c *RunnerConfig) defaults() {
	if c.ID == "" {
		c.ID = "runner-" + nuid.Next()
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 64
	}
	if c.MaxPerBatch <= 0 {
		c.MaxPerBatch = 32
	}
	if c.Priority == 0 {
		c.Priority = 100
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Minute
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 20
	}
	if c.Poll <= 0 {
		c.Poll = 250 * time.Millisecond
	}
	if c.ValidationTimeout <= 0 {
		c.ValidationTimeout = 90 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// leaseFor is how long a runner holds a finalizing batch before another
// may take it over (it died); a validation holds its batch for
// ValidationTimeout and this much more (validationLease).
const leaseFor = 2 * time.Minute

// retryAfter is how long a batch whose validation or finalisation failed
// for want of JetStream (or Redis) waits before a runner tries again: not
// every Poll, reading the whole file or every result each time.
const retryAfter = 30 * time.Second

// forceEndAfter: a batch not ended this long after its expires_at (its
// finalisation keeps failing, its lines cannot be taken) is ended without
// its output files (forceEnd), so that no batch stays open for ever.
const forceEndAfter = time.Hour

// Runner runs batches: it validates and queues new batches, runs their
// lines through the bus with cl, records each result once, and finalises
// batches whose lines are all answered. Any number of runners (one per
// gateway) share the work: leases in the batch records and the work
// queue's acknowledgements keep them from doing anything twice that
// matters; a result recorded twice is stored once.
type Runner struct {
	cfg RunnerConfig
	s   *Store
	cl  *client.Client
	log *slog.Logger
	m   runnerMetrics

	wake chan struct{}

	mu         sync.Mutex
	recs       map[string]record // non-terminal batches, as last seen
	running    map[string]int    // lines of each batch running here
	inFlight   int
	busy       map[string]bool                    // batches being validated or finalised here
	validating map[string]context.CancelCauseFunc // validations running here, stopped by a cancel
	cons       map[string]jetstream.Consumer
	turn       int // round-robin start among batches (step)
	tenantTurn int // and among tenants (pullFairly); both only on Run's goroutine

	wg sync.WaitGroup // lines, validations and finalisations
}

// NewRunner makes a runner of s's batches that sends lines with cl.
func NewRunner(s *Store, cl *client.Client, cfg RunnerConfig) *Runner {
	cfg.defaults()
	return &Runner{cfg: cfg, s: s, cl: cl, log: cfg.Log, m: newRunnerMetrics(cfg.Metrics),
		wake: make(chan struct{}, 1), recs: map[string]record{}, running: map[string]int{},
		busy: map[string]bool{}, validating: map[string]context.CancelCauseFunc{}, cons: map[string]jetstream.Consumer{}}
}

type runnerMetrics struct {
	lines    *prometheus.CounterVec
	inflight prometheus.Gauge
	active   prometheus.Gauge
}

func newRunnerMetrics(reg prometheus.Registerer) runnerMetrics {
	m := runnerMetrics{
		lines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_batch_lines_total",
			Help: "Batch lines this runner answered, by outcome (ok, error, cancelled, expired, revoked: the batch's API key was deleted), and those sent back to the queue to run again (retried).",
		}, []string{"outcome"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenbus_batch_lines_running",
			Help: "Batch lines this runner is running now.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenbus_batches_active",
			Help: "Batches not yet ended (validating, in progress, cancelling, finalizing), as this runner sees them.",
		}),
	}
	for _, o := range []string{"ok", "error", "cancelled", "expired", "revoked", "retried"} {
		m.lines.WithLabelValues(o) // each from start-up, at 0
	}
	if reg != nil {
		reg.MustRegister(m.lines, m.inflight, m.active)
	}
	return m
}

// Run runs batches until ctx ends, then lets running lines end (they are
// cancelled and go back to the queue for another runner) and returns.
func (r *Runner) Run(ctx context.Context) error {
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); r.watch(ctx) }()
	tick := time.NewTicker(r.cfg.Poll)
	defer tick.Stop()
	for ctx.Err() == nil {
		r.step(ctx)
		// With no batch to look at, the watcher's poke is what brings one:
		// an idle runner does not wake every Poll.
		poll := tick.C
		if r.idle() {
			poll = nil
		}
		select {
		case <-ctx.Done():
		case <-poll:
		case <-r.wake:
		}
	}
	r.wg.Wait()
	<-watchDone
	return nil
}

// idle reports whether no batch is known and none is being worked on.
func (r *Runner) idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs) == 0 && len(r.busy) == 0
}

// poke wakes Run's loop (a line ended, a record changed).
func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// watch keeps recs up to date from the batches bucket: one watcher, which
// delivers every record once when it starts and then only changes, so that
// the runner reads what changed, not every batch ever made (ended ones
// included) on a timer. After a reconnect to NATS (the server may have
// restarted, losing the watcher's consumer: the watcher would only notice
// its missing heartbeats some 20 s later) a new watcher reads every record
// again, once; so does one that ended for any other reason.
func (r *Runner) watch(ctx context.Context) {
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		if r.watchOnce(ctx) {
			backoff = 250 * time.Millisecond
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// watchOnce runs one watcher until it ends or the connection reconnects;
// ok says it delivered the records at all.
func (r *Runner) watchOnce(ctx context.Context) (ok bool) {
	nc := r.s.js.Conn()
	reconnects := nc.Stats().Reconnects
	w, err := r.s.batches.WatchAll(ctx)
	if err != nil {
		r.log.Debug("batch: watching the batches bucket", "err", err)
		return false
	}
	defer func() { _ = w.Stop() }()
	check := time.NewTicker(time.Second)
	defer check.Stop()
	fresh := map[string]record{} // the records as of the watcher's start
	initial := true
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return ok
		case <-check.C:
			if nc.Stats().Reconnects != reconnects {
				return ok
			}
			continue
		case u, open := <-w.Updates():
			if !open {
				return ok
			}
			e = u
		}
		switch {
		case e == nil && initial: // every record delivered once: the watcher's view replaces ours
			initial, ok = false, true
			r.mu.Lock()
			r.recs = fresh
			r.mu.Unlock()
			r.stopValidations()
			r.poke()
		case e == nil:
		case initial:
			var rec record
			if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &rec) == nil && !terminal(rec.Status) {
				fresh[rec.ID] = rec
			}
		default:
			r.seen(e)
		}
	}
}

// seen takes one change of the batches bucket.
func (r *Runner) seen(e jetstream.KeyValueEntry) {
	var rec record
	if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &rec) != nil {
		r.mu.Lock()
		delete(r.recs, e.Key())
		if stop := r.validating[e.Key()]; stop != nil {
			stop(errCancelled) // deleted: nothing to validate
		}
		r.mu.Unlock()
		return
	}
	r.note(rec)
	r.poke()
}

// note records what this runner itself wrote, before the watcher brings it.
func (r *Runner) note(rec record) {
	r.mu.Lock()
	if terminal(rec.Status) {
		delete(r.recs, rec.ID)
	} else {
		r.recs[rec.ID] = rec
	}
	r.mu.Unlock()
	r.stopValidations()
}

// errCancelled stops a validation whose batch was cancelled or ended
// meanwhile (by its tenant, or by another runner: expired).
var errCancelled = errors.New("the batch was cancelled while it was validated")

// stopValidations stops this runner's validations of batches that are no
// longer validating (cancelled, or ended by another runner), so that a
// cancel reaches a validation at once, not when it ends.
func (r *Runner) stopValidations() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, stop := range r.validating {
		if rec, ok := r.recs[id]; ok && rec.Status != StatusValidating {
			stop(errCancelled)
		}
	}
}

// step looks at every live batch once: validates new ones, starts lines
// of running ones while there is room, finalises those all answered.
func (r *Runner) step(ctx context.Context) {
	r.mu.Lock()
	ids := make([]string, 0, len(r.recs))
	for id := range r.recs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if len(ids) > 0 {
		r.turn = (r.turn + 1) % len(ids)
		ids = append(ids[r.turn:], ids[:r.turn]...) // fair: a different batch goes first each time
	}
	r.m.active.Set(float64(len(ids)))
	r.mu.Unlock()
	now := time.Now()
	var running []record
	for _, id := range ids {
		r.mu.Lock()
		rec, ok := r.recs[id]
		busy := r.busy[id]
		r.mu.Unlock()
		if !ok || busy {
			continue
		}
		switch {
		case stuck(rec, now):
			r.background(id, func() { r.forceEnd(ctx, id) })
		case unvalidated(rec):
			// Cancelled before its lines were queued: ended now, whoever
			// holds its validation (that one finds it ended and stops).
			r.background(id, func() { r.endUnvalidated(ctx, id, StatusCancelled, r.revokedErrors(ctx, rec), 0) })
		case rec.Status == StatusValidating && expired(rec, now):
			r.background(id, func() { r.endUnvalidated(ctx, id, StatusExpired, nil, 0) })
		case rec.Status == StatusValidating:
			if rec.LeaseUntil < now.UnixMilli() {
				r.background(id, func() { r.validate(ctx, id) })
			}
		case rec.Status == StatusFinalizing:
			if rec.LeaseUntil < now.UnixMilli() {
				r.background(id, func() { r.finalize(ctx, id) })
			}
		case rec.Status == StatusInProgress || rec.Status == StatusCancelling:
			if rec.LeaseUntil < now.UnixMilli() && r.answered(ctx, rec) {
				r.background(id, func() { r.finalize(ctx, id) })
				continue
			}
			running = append(running, rec)
		}
	}
	r.pullFairly(ctx, running)
}

// pullFairly shares this runner's free room between the tenants of the
// running batches, and each tenant's part between its batches: a tenant
// with ten batches gets no more than one with one. Tenants, and a tenant's
// batches, take turns going first, so a remainder goes to each in turn.
func (r *Runner) pullFairly(ctx context.Context, running []record) {
	var tenants []string
	byTenant := map[string][]record{}
	for _, rec := range running {
		if _, seen := byTenant[rec.Tenant]; !seen {
			tenants = append(tenants, rec.Tenant)
		}
		byTenant[rec.Tenant] = append(byTenant[rec.Tenant], rec)
	}
	// Tenants take turns going first, whatever their number of batches.
	if len(tenants) > 1 {
		slices.Sort(tenants)
		r.tenantTurn = (r.tenantTurn + 1) % len(tenants)
		tenants = append(tenants[r.tenantTurn:], tenants[:r.tenantTurn]...)
	}
	for ti, tenant := range tenants {
		r.mu.Lock()
		free := r.cfg.MaxInFlight - r.inFlight
		r.mu.Unlock()
		budget := ceilDiv(free, len(tenants)-ti)
		batches := byTenant[tenant]
		for bi, rec := range batches {
			if budget <= 0 {
				break
			}
			budget -= r.pull(ctx, rec, ceilDiv(budget, len(batches)-bi))
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / max(b, 1) }

// unvalidated: a batch cancelled before its lines were queued (validation
// sets the model and the total as it queues them). It ends cancelled at
// once, without its file being read: a file that cannot be validated
// cannot hold its cancel up.
func unvalidated(rec record) bool {
	return rec.Status == StatusCancelling && rec.Model == "" && rec.RequestCounts.Total == 0
}

// expired: rec is past its expires_at.
func expired(rec record, now time.Time) bool {
	return rec.ExpiresAt != nil && now.Unix() >= *rec.ExpiresAt
}

// stuck: rec has been past its expires_at for forceEndAfter and is still
// running or finalising (validating ones end at expires_at).
func stuck(rec record, now time.Time) bool {
	return !terminal(rec.Status) && rec.Status != StatusValidating && !unvalidated(rec) &&
		rec.ExpiresAt != nil && now.After(time.Unix(*rec.ExpiresAt, 0).Add(forceEndAfter))
}

// background runs fn for batch id, one at a time per batch.
func (r *Runner) background(id string, fn func()) {
	r.mu.Lock()
	r.busy[id] = true
	r.mu.Unlock()
	r.wg.Go(func() {
		defer func() {
			r.mu.Lock()
			delete(r.busy, id)
			r.mu.Unlock()
			r.poke()
		}()
		fn()
	})
}

// answered reports whether every line of rec has a result recorded.
func (r *Runner) answered(ctx context.Context, rec record) bool {
	ok, failed, err := r.s.resultCounts(ctx, rec.ID)
	return err == nil && rec.RequestCounts.Total > 0 && ok+failed >= rec.RequestCounts.Total
}

// ending says why lines of rec no longer run ("" while they do).
func ending(rec record, now time.Time) string {
	switch {
	case rec.Status == StatusCancelling:
		return "batch_cancelled"
	case expired(rec, now):
		return "batch_expired"
	}
	return ""
}

// pull takes lines of rec while this runner has room: at most share and,
// for lines that will run, the model's free capacity (lines of a cancelled
// or expired batch are answered without running: they take none). It
// returns how many it took.
func (r *Runner) pull(ctx context.Context, rec record, share int) (taken int) {
	r.mu.Lock()
	room := min(r.cfg.MaxInFlight-r.inFlight, r.cfg.MaxPerBatch-r.running[rec.ID], share)
	r.mu.Unlock()
	if ending(rec, time.Now()) == "" && !r.revoked(ctx, rec) && r.cfg.Capacity != nil {
		room = min(room, r.cfg.Capacity(rec.Model))
	}
	if room <= 0 {
		return 0
	}
	cons, err := r.consumer(ctx, rec.ID)
	if err != nil {
		r.log.Debug("batch: no consumer for the batch's lines", "batch", rec.ID, "err", err)
		return 0
	}
	msgs, err := cons.FetchNoWait(room)
	if err != nil {
		// Debug: while NATS is away this fails every Poll, and the
		// connection's own lines already say so.
		r.log.Debug("batch: fetching lines", "batch", rec.ID, "err", err)
		return 0
	}
	for msg := range msgs.Messages() {
		taken++
		r.mu.Lock()
		r.inFlight++
		r.running[rec.ID]++
		r.m.inflight.Set(float64(r.inFlight))
		r.mu.Unlock()
		r.wg.Go(func() {
			defer func() {
				r.mu.Lock()
				r.inFlight--
				if r.running[rec.ID]--; r.running[rec.ID] <= 0 {
					delete(r.running, rec.ID)
				}
				r.m.inflight.Set(float64(r.inFlight))
				r.mu.Unlock()
				r.poke()
			}()
			r.runLine(ctx, rec.ID, msg)
		})
	}
	if err := msgs.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		r.log.Debug("batch: fetching lines", "batch", rec.ID, "err", err)
	}
	return taken
}

var errNotRunning = errors.New("the batch is not running")

// consumerName is the durable consumer of a batch's work subject (one per
// batch: the work queue stream allows one per subject, and a consumer per
// batch is what lets runners take lines of every batch in turn).
func consumerName(id string) string { return "lines_" + id }

func (r *Runner) consumer(ctx context.Context, id string) (jetstream.Consumer, error) {
	r.mu.Lock()
	c := r.cons[id]
	r.mu.Unlock()
	if c != nil {
		return c, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The record as stored, not as last seen: a full re-read can bring back
	// a batch that has since ended, whose consumer must not come back.
	rec, _, err := r.s.get(cctx, id)
	if err != nil {
		return nil, err
	}
	if rec.Status != StatusInProgress && rec.Status != StatusCancelling {
		r.note(rec)
		return nil, errNotRunning
	}
	c, err = r.s.work.CreateOrUpdateConsumer(cctx, jetstream.ConsumerConfig{
		Durable:       consumerName(id),
		Description:   "the lines of batch " + id + ", taken by every runner",
		FilterSubject: WorkPrefix + id,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		MaxDeliver:    -1, // runners count attempts themselves (MaxAttempts)
		MaxAckPending: 10_000,
		// A batch's consumer outlives its runners' restarts; one left behind
		// by a finalisation that crashed goes away on its own.
		InactiveThreshold: 24 * time.Hour,
	})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.cons[id] = c
	r.mu.Unlock()
	return c, nil
}

// lineReqID is a line's request id on the bus and its output line's id:
// the same on every attempt.
func lineReqID(batchID, line string) string {
	return "batch_req_" + batchID[len("batch_"):] + "_" + line
}

// runLine runs one work message and records its result, then acks it. A
// line that could not run for want of capacity goes back to the queue.
func (r *Runner) runLine(ctx context.Context, id string, msg jetstream.Msg) {
	var in InputLine
	if err := json.Unmarshal(msg.Data(), &in); err != nil {
		// Validation let no such line in; nothing can answer it.
		r.log.Error("batch: a queued line is not JSON; dropped", "batch", id, "line", msg.Headers().Get(HdrLine))
		_ = msg.Term()
		return
	}
	r.mu.Lock()
	rec, ok := r.recs[id]
	r.mu.Unlock()
	if !ok {
		// Not known here (yet, or any more): leave the line to a runner
		// that knows its batch.
		_ = msg.NakWithDelay(time.Second)
		return
	}
	out := OutputLine{ID: lineReqID(id, msg.Headers().Get(HdrLine)), CustomID: in.CustomID}
	outcome := "ok"
	if r.revoked(ctx, rec) {
		// Checked first: the batch is cancelled below, and its lines are
		// to say why.
		outcome = "revoked"
		out.Error = &LineError{Code: "key_revoked", Message: "This request was not run: the batch's API key was deleted."}
		r.cancelRevoked(ctx, rec)
	} else if why := ending(rec, time.Now()); why != "" {
		outcome = why[len("batch_"):]
		msg := "This request was not run: the batch was cancelled."
		if why == "batch_expired" {
			msg = "This request could not be executed before the completion window expired."
		}
		out.Error = &LineError{Code: why, Message: msg}
	} else {
		resp, again := r.call(ctx, rec, in, out.ID, msg)
		if again {
			r.m.lines.WithLabelValues("retried").Inc()
			delay := min(time.Duration(1+rand.IntN(4))*250*time.Millisecond, r.cfg.AckWait)
			_ = msg.NakWithDelay(delay)
			return
		}
		out.Response = resp
		if resp.StatusCode != 200 {
			outcome = "error"
		}
	}
	err := r.s.record(ctx, id, out)
	if errors.Is(err, nats.ErrMaxPayload) {
		// A result that can never be stored would run again for ever:
		// it is answered with why instead.
		r.log.Warn("batch: a line's result is over the NATS payload limit; answered response_too_large", "batch", id, "line", msg.Headers().Get(HdrLine))
		outcome = "error"
		out.Response, out.Error = nil, &LineError{Code: "response_too_large", Message: fmt.Sprintf(
			"The response was larger than the %d bytes a batch result may have, and was not kept.", r.s.maxPayload())}
		err = r.s.record(ctx, id, out)
	}
	if err != nil {
		r.log.Warn("batch: could not record a line's result; it runs again", "batch", id, "custom_id", in.CustomID, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	r.m.lines.WithLabelValues(outcome).Inc()
	_ = msg.Ack() // a lost ack runs the line again; its result is stored once
}

// revoked reports whether rec's API key has been deleted.
func (r *Runner) revoked(ctx context.Context, rec record) bool {
	return rec.KeyID != "" && r.cfg.KeyRevoked != nil && r.cfg.KeyRevoked(ctx, rec.KeyID)
}

// revokedErrors is the errors of a batch ended before validation because
// its API key was deleted (nil if it was not).
func (r *Runner) revokedErrors(ctx context.Context, rec record) []BatchError {
	if !r.revoked(ctx, rec) {
		return nil
	}
	return []BatchError{lineErr(0, "key_revoked", "",
		"The batch's API key was deleted before its input file was validated; no request was run.")}
}

// cancelRevoked cancels a running batch whose API key was deleted: its
// lines not yet run are answered key_revoked, and it ends cancelled, as a
// batch its tenant cancelled (the lines that ran are in its output file).
func (r *Runner) cancelRevoked(ctx context.Context, rec record) {
	if rec.Status != StatusInProgress {
		return // cancelling already, or finalising
	}
	now := time.Now().Unix()
	_, err := r.change(ctx, rec.ID, func(x *record) bool {
		if x.Status != StatusInProgress {
			return false
		}
		x.Status, x.CancellingAt = StatusCancelling, &now
		return true
	})
	if err != nil {
		r.log.Warn("batch: could not cancel the batch of a deleted API key; its lines are still answered key_revoked", "batch", rec.ID, "err", err)
		return
	}
	r.log.Info("batch: cancelled, its API key was deleted", "batch", rec.ID, "key_id", rec.KeyID)
}

// call sends one line through the bus and waits for its whole response.
// again is true when it should run later: it found no capacity, the bus
// was down, or this runner is stopping.
func (r *Runner) call(ctx context.Context, rec record, in InputLine, reqID string, msg jetstream.Msg) (resp *LineResponse, again bool) {
	kind := endpoints[rec.Endpoint]
	deadline := time.Now().Add(r.cfg.RequestTimeout)
	lctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	st, err := r.cl.Start(&client.Request{ID: reqID, Kind: kind, Model: rec.Model, Body: in.Body,
		Deadline: deadline, Priority: r.cfg.Priority, Tenant: rec.Tenant, Band: schemas.BandBatch})
	if err != nil {
		return r.failed(ctx, reqID, err, msg)
	}
	defer st.Close()
	// The line may run longer than AckWait: tell JetStream it is alive.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(r.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	for {
		f, err := st.Next(lctx)
		if err != nil {
			return r.failed(ctx, reqID, err, msg)
		}
		if f.Type == schemas.FrameDone {
			r.usage(rec, reqID, f.Payload)
			return &LineResponse{StatusCode: 200, RequestID: reqID, Body: json.RawMessage(f.Payload)}, false
		}
	}
}

// failed answers a line whose request failed: again for what capacity or
// a restart cures (503s, this runner stopping), up to MaxAttempts; else
// the error as the line's response, as OpenAI answers it.
func (r *Runner) failed(ctx context.Context, reqID string, err error, msg jetstream.Msg) (*LineResponse, bool) {
	if ctx.Err() != nil {
		return nil, true // stopping: another runner takes it at once
	}
	e := schemas.AsError(err)
	if e.Status == 503 {
		if md, merr := msg.Metadata(); merr != nil || int(md.NumDelivered) < r.cfg.MaxAttempts {
			return nil, true
		}
	}
	return &LineResponse{StatusCode: e.Status, RequestID: reqID, Body: e.JSON()}, false
}

// usage hands a line's usage to OnUsage.
func (r *Runner) usage(rec record, reqID string, done []byte) {
	if r.cfg.OnUsage == nil {
		return
	}
	var u schemas.Usage
	if p := schemas.UsageOf(done); p != nil {
		u = *p
	}
	r.cfg.OnUsage(schemas.UsageRecord{RequestID: reqID, KeyID: rec.KeyID, Tenant: rec.Tenant, Model: rec.Model, Usage: u})
}

// record stores a line's result once: its Nats-Msg-Id is the batch and
// custom_id, so the results stream drops a repeat (a line run again after
// a runner died before its ack), and finalising keeps the first of any
// repeat the window let through.
func (s *Store) record(ctx context.Context, id string, out OutputLine) error {
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	subject := ResultPrefix + id + ".err"
	if out.Response != nil && out.Response.StatusCode/100 == 2 {
		subject = ResultPrefix + id + ".ok"
	}
	// Stored even when the runner is stopping: the work is done.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err = s.js.PublishMsg(pctx, &nats.Msg{Subject: subject, Data: b,
		Header: nats.Header{jetstream.MsgIDHeader: []string{resultMsgID(id, out.CustomID)}}})
	return err
}

// resultMsgID is a result's Nats-Msg-Id, <batch-id>/<custom_id>, the
// custom_id query-escaped: it may hold any character, and a header value
// may not hold a line break.
func resultMsgID(id, customID string) string { return id + "/" + url.QueryEscape(customID) }
