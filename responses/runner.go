package responses

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// RunnerConfig tunes a Runner. Zero values take the defaults shown.
type RunnerConfig struct {
	// MaxInFlight: background responses and resumable streams this runner
	// generates at once; default 64. PerTenant: of one tenant; default
	// MaxInFlight/4 (at least 1), so that one tenant's backlog leaves most
	// slots to others, however long its generations run.
	MaxInFlight, PerTenant int
	AckWait                time.Duration // a response whose runner died is taken over after it; default 30s
	// RequestTimeout bounds one generation of a background response, and
	// a resumable stream from its start when its record has no deadline;
	// default 10m.
	RequestTimeout time.Duration
	// Poll: how often the work queue is looked at for work queued by other
	// gateways (this store's own is taken at once); default 1s.
	Poll time.Duration
	// MaxAttempts: deliveries of one response whose runs fail (JetStream
	// unavailable, runners that die) before it ends failed, in band;
	// default 20, retried after 1s, 2s, 4s... up to a minute apart.
	MaxAttempts int
	// KeyRevoked, if set, says whether an API key was deleted: a response
	// of a deleted key ends failed when a runner takes it, and a running
	// one stops within RevokeCheck (default 1s). nil: keys are never
	// revoked.
	KeyRevoked  func(ctx context.Context, keyID string) bool
	RevokeCheck time.Duration
	Log         *slog.Logger
	// OnUsage, if set, gets each finished background response's usage.
	OnUsage func(rec schemas.UsageRecord)
}

// Runner runs background responses and resumable chat streams: any number
// of runners (one per gateway) share the work queue, one subject and one
// durable consumer per tenant, and each runner gives its free slots to the
// tenants with work in turn, fewest running first, none past PerTenant.
// Each appends a response's events to its subject with the expected last
// sequence, so that the events have one order with no gap or repeat. A
// runner that dies leaves its message unacknowledged: after AckWait
// another takes it, replays the events stored, and continues the
// generation after their text (the chat request with the partial answer
// as a final assistant message).
type Runner struct {
	s      *Store
	cl     *client.Client
	cfg    RunnerConfig
	queues map[string]*queue // by tenant token; the scheduler's alone
	busy   int               // runs going on
	ended  chan *queue       // a run ended
}

// queue is one tenant's work as this runner sees it.
type queue struct {
	key     string // the tenant token; legacyKey for work queued before tenants had subjects
	cons    jetstream.Consumer
	ready   bool      // the last look saw work that no fetch has found gone since
	running int       // its runs on this runner
	served  time.Time // when this runner last started one of its runs
}

// legacyKey is the queue of work an older tokenbus queued on WorkPrefix +
// <id>, read by its consumer "runners" narrowed to those subjects.
const (
	legacyKey      = ""
	legacyConsumer = "runners"
)

// sweepEvery: how often the consumers of tenants with no work are deleted.
const sweepEvery = 10 * time.Minute

// NewRunner makes a runner of s's background responses.
func NewRunner(s *Store, cl *client.Client, cfg RunnerConfig) *Runner {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.PerTenant <= 0 {
		cfg.PerTenant = max(1, cfg.MaxInFlight/4)
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Minute
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 20
	}
	if cfg.RevokeCheck <= 0 {
		cfg.RevokeCheck = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Runner{s: s, cl: cl, cfg: cfg, queues: map[string]*queue{}, ended: make(chan *queue, cfg.MaxInFlight)}
}

// Run takes background responses and resumable streams until ctx ends.
// JetStream's faults are logged and waited out: Run returns only then.
func (r *Runner) Run(ctx context.Context) error {
	r.narrowLegacy(ctx)
	poll := time.NewTicker(r.cfg.Poll)
	defer poll.Stop()
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	r.look(ctx)
	for ctx.Err() == nil {
		// What happened meanwhile first, so that a busy loop still hears
		// of new tenants and of slots freed.
		for more := true; more; {
			select {
			case q := <-r.ended:
				r.done(q)
			case tok := <-r.s.queued:
				r.queue(tok).ready = true
			case <-poll.C:
				r.look(ctx)
			default:
				more = false
			}
		}
		q := r.pick()
		if q == nil {
			select {
			case <-ctx.Done():
			case q := <-r.ended:
				r.done(q)
			case tok := <-r.s.queued:
				r.queue(tok).ready = true
			case <-poll.C:
				r.look(ctx)
			case <-sweep.C:
				r.sweep(ctx)
			}
			continue
		}
		m, err := r.fetch(ctx, q)
		if err != nil {
			r.cfg.Log.Debug("responses: work queue", "err", err)
		}
		if m == nil {
			q.ready = false // until the next look, or this store queues one
			continue
		}
		q.running++
		r.busy++
		q.served = time.Now()
		go func() {
			defer func() { r.ended <- q }()
			r.run(ctx, m)
		}()
	}
	return nil
}

func (r *Runner) done(q *queue) {
	q.running--
	r.busy--
}

func (r *Runner) queue(key string) *queue {
	q := r.queues[key]
	if q == nil {
		q = &queue{key: key}
		r.queues[key] = q
	}
	return q
}

// pick is the queue to take the next run from: a free slot, then the
// tenant with work and the fewest runs here, the longest unserved first;
// none past PerTenant.
func (r *Runner) pick() *queue {
	if r.busy >= r.cfg.MaxInFlight {
		return nil
	}
	var best *queue
	for _, q := range r.queues {
		if !q.ready || q.running >= r.cfg.PerTenant {
			continue
		}
		if best == nil || q.running < best.running || q.running == best.running && q.served.Before(best.served) {
			best = q
		}
	}
	return best
}

// look reads which tenants have work queued or running: one count per
// subject of the work queue (a tenant and a kind each).
func (r *Runner) look(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := r.s.work.Info(lctx, jetstream.WithSubjectFilter(WorkPrefix+">"))
	if err != nil {
		r.cfg.Log.Debug("responses: could not look at the work queue", "err", err)
		return
	}
	for subj, n := range info.State.Subjects {
		if n > 0 {
			r.queue(queueKey(subj)).ready = true
		}
	}
}

func queueKey(subject string) string {
	rest := strings.TrimPrefix(subject, WorkPrefix)
	if tok, _, ok := strings.Cut(rest, "."); ok {
		return tok
	}
	return legacyKey
}

func consumerName(key string) string {
	if key == legacyKey {
		return legacyConsumer
	}
	return "q_" + key
}

// fetch takes one message of q's tenant, if one is waiting; nil if none.
func (r *Runner) fetch(ctx context.Context, q *queue) (jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if q.cons == nil {
		filter := WorkPrefix + q.key + ".*"
		if q.key == legacyKey {
			filter = WorkPrefix + "*"
		}
		c, err := r.s.work.CreateOrUpdateConsumer(fctx, jetstream.ConsumerConfig{Durable: consumerName(q.key),
			Description: "tokenbus responses runners: one tenant's work", FilterSubject: filter,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: r.cfg.AckWait,
			// Never dropped by the server: a response that keeps failing
			// is ended by the runner (MaxAttempts), in band.
			MaxDeliver: -1, MaxAckPending: 10_000})
		if err != nil {
			return nil, err
		}
		q.cons = c
	}
	b, err := q.cons.FetchNoWait(1)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			q.cons = nil // swept by a runner that saw no work: made again
		}
		return nil, err
	}
	for m := range b.Messages() {
		return m, nil
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			q.cons = nil
		}
		return nil, err
	}
	return nil, nil
}

// narrowLegacy: an older tokenbus read the whole work queue with one
// unfiltered consumer, beside which a work queue takes no other; narrowed
// to the old subjects, it is one more queue (legacyKey), swept once empty.
func (r *Runner) narrowLegacy(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := r.s.work.Consumer(lctx, legacyConsumer)
	if err != nil {
		return
	}
	cfg := c.CachedInfo().Config
	if cfg.FilterSubject != "" || len(cfg.FilterSubjects) > 0 {
		return
	}
	cfg.FilterSubject, cfg.MaxDeliver = WorkPrefix+"*", -1
	if _, err := r.s.work.UpdateConsumer(lctx, cfg); err != nil {
		r.cfg.Log.Warn("responses: could not narrow the old runners consumer; work queued by this version waits until it is gone", "err", err)
	}
}

// sweep deletes the consumers of tenants with no work left, so that the
// work queue holds one per tenant with work, not per tenant ever seen. One
// that a submit needs again is made again by the next fetch.
func (r *Runner) sweep(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	names := r.s.work.ListConsumers(sctx)
	for info := range names.Info() {
		key, ok := strings.CutPrefix(info.Name, "q_")
		if !ok && info.Name != legacyConsumer {
			continue
		}
		if info.Name == legacyConsumer {
			key = legacyKey
		}
		if info.NumPending > 0 || info.NumAckPending > 0 || r.queues[key] != nil && r.queues[key].running > 0 {
			continue
		}
		if err := r.s.work.DeleteConsumer(sctx, info.Name); err == nil {
			if q := r.queues[key]; q != nil {
				q.cons = nil
				if !q.ready {
					delete(r.queues, key)
				}
			}
		}
	}
}

// run generates one background response or resumable stream, or the rest
// of it.
func (r *Runner) run(ctx context.Context, m jetstream.Msg) {
	id := string(m.Data())
	rec, rev, err := r.s.get(ctx, id)
	if err != nil {
		if schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
			_ = m.Term() // deleted
			return
		}
		r.retry(ctx, m, id, err)
		return
	}
	if Ended(rec.Response.Status) {
		_ = m.Ack()
		return
	}
	// Tell JetStream this runner is alive while it generates.
	alive, stopAlive := context.WithCancel(ctx)
	defer stopAlive()
	go func() {
		t := time.NewTicker(r.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-alive.Done():
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	gctx, stop := r.generation(ctx, rec)
	defer stop()

	if rec.Kind == KindChat {
		status, err := r.runChat(gctx, rec)
		r.finish(ctx, m, rec, rev, nil, status, err)
		return
	}
	resp := rec.Response
	var last uint64
	gen := NewGen(&resp, func(ev *Event) error {
		// Bounded, and past the generation's own end: an event is written
		// whole or the message goes back to the queue.
		actx, cancel := context.WithTimeout(context.WithoutCancel(gctx), 10*time.Second)
		defer cancel()
		seq, err := r.s.append(actx, id, ev, last)
		if err != nil {
			return err
		}
		last = seq
		return nil
	})
	if last, err = r.s.replay(ctx, id, gen); err != nil {
		r.retry(ctx, m, id, err)
		return
	}
	if !gen.Ended() {
		err = r.generate(gctx, rec, gen)
	}
	r.finish(ctx, m, rec, rev, gen, "", err)
}

// generation is the context of one run: its deadline (a resumable
// stream's from its start, a background response's from this run) and,
// with KeyRevoked, its key's deletion. Either ends it with its cause, a
// *schemas.Error that ends the response in band (endCause).
func (r *Runner) generation(ctx context.Context, rec *Record) (context.Context, func()) {
	deadline := time.Now().Add(r.cfg.RequestTimeout)
	if rec.Kind == KindChat {
		deadline = time.Unix(rec.Response.CreatedAt, 0).Add(r.cfg.RequestTimeout)
		if rec.Deadline > 0 {
			deadline = time.UnixMilli(rec.Deadline)
		}
	}
	tctx, stopT := context.WithDeadlineCause(ctx, deadline, schemas.ErrRequestTimeout.New(r.cfg.RequestTimeout))
	gctx, cancel := context.WithCancelCause(tctx)
	if r.cfg.KeyRevoked != nil && rec.KeyID != "" {
		revoked := func() bool {
			cctx, c := context.WithTimeout(gctx, 5*time.Second)
			defer c()
			return r.cfg.KeyRevoked(cctx, rec.KeyID)
		}
		if revoked() {
			cancel(schemas.ErrKeyRevoked.New(rec.KeyID))
		} else {
			go func() {
				t := time.NewTicker(r.cfg.RevokeCheck)
				defer t.Stop()
				for {
					select {
					case <-gctx.Done():
						return
					case <-t.C:
						if revoked() {
							cancel(schemas.ErrKeyRevoked.New(rec.KeyID))
							return
						}
					}
				}
			}()
		}
	}
	return gctx, func() { cancel(nil); stopT() }
}

// endCause is the error that ended a generation's context (its deadline,
// its key revoked); nil when it has not ended, or ended because the runner
// stops (then the response is left to another runner).
func endCause(ctx context.Context) *schemas.Error {
	if ctx.Err() == nil {
		return nil
	}
	var e *schemas.Error
	if errors.As(context.Cause(ctx), &e) {
		return e
	}
	return nil
}

// retry sends m back to run again after a pause that grows with its
// deliveries; at MaxAttempts it ends the response failed instead, in band,
// so that its client sees an error rather than a stream that never ends.
// If even that cannot be written the message stays queued: a response is
// never dropped.
func (r *Runner) retry(ctx context.Context, m jetstream.Msg, id string, cause error) {
	if ctx.Err() != nil {
		return // stopping: redelivered to another runner after AckWait
	}
	n := 1
	if md, err := m.Metadata(); err == nil {
		n = int(md.NumDelivered)
	}
	log := r.cfg.Log.With("response", id, "attempt", n)
	if n >= r.cfg.MaxAttempts {
		e := schemas.ErrResponseLost.New(n, "JetStream: "+cause.Error())
		if err := r.fail(ctx, m, id, e); err == nil {
			log.Error("responses: ended failed after its runs kept failing", "err", cause)
			_ = m.Ack()
			return
		} else {
			log.Error("responses: could not end a response that keeps failing; kept queued", "err", cause, "end_err", err)
		}
	} else {
		log.Warn("responses: run failed; retried", "err", cause)
	}
	_ = m.NakWithDelay(min(time.Minute, time.Second<<min(n-1, 6)))
}

// fail ends response id with e: its terminal event (response.failed, or
// the chat stream's error line) after those stored, then its record.
func (r *Runner) fail(ctx context.Context, m jetstream.Msg, id string, e *schemas.Error) error {
	rec, rev, err := r.s.get(ctx, id)
	if schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
		return nil // deleted
	}
	chat := strings.HasSuffix(m.Subject(), "."+kindChat) || rec != nil && rec.Kind == KindChat
	if err != nil {
		// The record cannot be read: its followers still get the end.
		if chat {
			_, err = r.endChat(ctx, id, e)
			return err
		}
		gen := NewGen(&Response{}, nil)
		last, err := r.s.replay(ctx, id, gen)
		if err != nil || gen.Ended() {
			return err
		}
		code := "response_failed"
		_, err = r.s.append(ctx, id, &Event{Type: "error", SequenceNumber: gen.Seq(), Code: &code, Message: e.Body.Message}, last)
		return err
	}
	if Ended(rec.Response.Status) {
		return nil
	}
	if chat {
		if _, err := r.endChat(ctx, id, e); err != nil {
			return err
		}
		end := rec.Response
		end.Status = StatusFailed
		r.settle(ctx, rec, rev, end)
		return nil
	}
	resp := rec.Response
	var last uint64
	gen := NewGen(&resp, func(ev *Event) error {
		seq, err := r.s.append(ctx, id, ev, last)
		last = seq
		return err
	})
	if last, err = r.s.replay(ctx, id, gen); err != nil {
		return err
	}
	if !gen.Ended() {
		if gen.Seq() == 0 {
			if err := gen.Begin(); err != nil {
				return err
			}
		}
		if err := gen.End(e); err != nil {
			return err
		}
	}
	r.settle(ctx, rec, rev, *gen.Resp)
	return nil
}

// finish ends a run: the record follows the events (its end state, unless
// a cancel came first), then the ack. A conflict (a cancel, or a runner
// that took over) acks; another error sends the message back. status is a
// chat stream's end ("" for a background response, whose gen says).
func (r *Runner) finish(ctx context.Context, m jetstream.Msg, rec *Record, rev uint64, gen *Gen, status string, err error) {
	id := rec.Response.ID
	log := r.cfg.Log.With("response", id)
	if errors.Is(err, errConflict) {
		log.Info("responses: another writer appended (a cancel, or a runner that took over); stopping")
		_ = m.Ack()
		return
	}
	if err != nil {
		r.retry(ctx, m, id, err)
		return
	}
	end := rec.Response
	end.Status = status
	if gen != nil {
		end = *gen.Resp
	}
	r.settle(ctx, rec, rev, end)
	if gen != nil {
		r.usage(rec, gen.Resp)
	}
	_ = m.Ack()
}

// settle writes the record's end state, unless it ended first (a cancel).
func (r *Runner) settle(ctx context.Context, rec *Record, rev uint64, end Response) {
	var err error
	for range 10 {
		if Ended(rec.Response.Status) {
			return
		}
		rec.Response = end
		rec.Body = nil
		if _, err = r.s.update(ctx, rec, rev); err == nil {
			return
		}
		if rec, rev, err = r.s.get(ctx, rec.Response.ID); err != nil {
			return
		}
	}
}

func (r *Runner) generate(ctx context.Context, rec *Record, gen *Gen) error {
	if gen.Seq() == 0 {
		if err := gen.Begin(); err != nil {
			return err
		}
	}
	if e := endCause(ctx); e != nil {
		return gen.End(e) // its key was deleted, or its time is up, before it started
	}
	body, err := gen.Resume(rec.Body)
	if err != nil {
		return gen.End(schemas.ErrInternal.New("the request could not be continued"))
	}
	if body == nil { // the text had reached max_output_tokens
		return gen.End(nil)
	}
	deadline, _ := ctx.Deadline()
	err = gen.Run(ctx, r.cl, &client.Request{ID: rec.Response.ID + "_" + itoa(gen.Seq()), Kind: schemas.KindChat,
		Model: rec.Response.Model, Body: body, Deadline: deadline, Tenant: rec.Tenant,
		Band: schemas.BandBatch}) // background work: below every interactive request (docs/scheduling.md)
	if e := endCause(ctx); e != nil && err != nil && !errors.Is(err, errConflict) && !gen.Ended() {
		return gen.End(e)
	}
	var e *schemas.Error
	if errors.As(err, &e) {
		return gen.End(e) // failed before any token: in band, as the response's error
	}
	return err
}

func itoa(n int) string { return strconv.Itoa(n) }

func (r *Runner) usage(rec *Record, resp *Response) {
	if r.cfg.OnUsage == nil || resp.Usage == nil {
		return
	}
	r.cfg.OnUsage(schemas.UsageRecord{RequestID: resp.ID, KeyID: rec.KeyID, Tenant: rec.Tenant, Model: resp.Model,
		Usage: schemas.Usage{PromptTokens: resp.Usage.InputTokens, CompletionTokens: resp.Usage.OutputTokens,
			TotalTokens: resp.Usage.TotalTokens}, Reserved: rec.Reserved, Window: rec.Window})
}
