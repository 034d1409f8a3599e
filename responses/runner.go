package responses

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// RunnerConfig tunes a Runner.
type RunnerConfig struct {
	MaxInFlight    int           // background responses this runner generates at once; default 16
	AckWait        time.Duration // a response whose runner died is taken over after it; default 30s
	RequestTimeout time.Duration // of one generation; default 10m
	Log            *slog.Logger
	// OnUsage, if set, gets each finished background response's usage.
	OnUsage func(rec schemas.UsageRecord)
}

// Runner runs background responses: any number of runners (one per
// gateway) share the work queue. Each appends a response's events to its
// subject with the expected last sequence, so that the events have one
// order with no gap or repeat. A runner that dies leaves its message
// unacknowledged: after AckWait another takes it, replays the events
// stored, and continues the generation after their text (the chat
// request with the partial answer as a final assistant message).
type Runner struct {
	s   *Store
	cl  *client.Client
	cfg RunnerConfig
}

// NewRunner makes a runner of s's background responses.
func NewRunner(s *Store, cl *client.Client, cfg RunnerConfig) *Runner {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 16
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Runner{s: s, cl: cl, cfg: cfg}
}

// Run takes background responses until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	var cons jetstream.Consumer
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		var err error
		if cons, err = r.s.work.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "runners",
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: r.cfg.AckWait, MaxAckPending: r.cfg.MaxInFlight * 4,
			MaxDeliver: 20}); err == nil {
			break
		}
		// JetStream not ready (a server just restarted, a cluster without
		// a leader yet): the runner waits for it rather than end the program.
		r.cfg.Log.Warn("responses: cannot create the work queue's consumer yet; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	sem := make(chan struct{}, r.cfg.MaxInFlight)
	it, err := cons.Messages(jetstream.PullMaxMessages(r.cfg.MaxInFlight))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			<-sem
			// NATS away (missed heartbeats and the like): the iterator
			// recovers by itself; do not spin meanwhile.
			r.cfg.Log.Debug("responses: work queue", "err", err)
			select {
			case <-time.After(250 * time.Millisecond):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		go func() {
			defer func() { <-sem }()
			r.run(ctx, m)
		}()
	}
}

// run generates one background response, or the rest of it.
func (r *Runner) run(ctx context.Context, m jetstream.Msg) {
	id := string(m.Data())
	rec, rev, err := r.s.get(ctx, id)
	if err != nil {
		if schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
			_ = m.Term() // deleted
			return
		}
		_ = m.NakWithDelay(time.Second)
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

	if rec.Kind == KindChat {
		r.finish(ctx, m, rec, rev, nil, r.runChat(ctx, rec))
		return
	}
	resp := rec.Response
	var last uint64
	gctx, cancel := context.WithTimeoutCause(ctx, r.cfg.RequestTimeout, schemas.ErrRequestTimeout.New(r.cfg.RequestTimeout))
	defer cancel()
	gen := NewGen(&resp, func(ev *Event) error {
		// Bounded, and past the runner's own end: an event is written
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
		_ = m.NakWithDelay(time.Second)
		return
	}
	if !gen.Ended() {
		err = r.generate(gctx, rec, gen)
	}
	r.finish(ctx, m, rec, rev, gen, err)
}

// finish ends a run: the record follows the events (its end state, unless
// a cancel came first), then the ack. A conflict (a cancel, or a runner
// that took over) acks; another error sends the message back.
func (r *Runner) finish(ctx context.Context, m jetstream.Msg, rec *Record, rev uint64, gen *Gen, err error) {
	id := rec.Response.ID
	log := r.cfg.Log.With("response", id)
	if errors.Is(err, errConflict) {
		log.Info("responses: another writer appended (a cancel, or a runner that took over); stopping")
		_ = m.Ack()
		return
	}
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: the message is redelivered to another runner
		}
		log.Warn("responses: background response could not be written; retried", "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	end := rec.Response
	end.Status = StatusCompleted
	if gen != nil {
		end = *gen.Resp
	}
	for range 10 {
		if Ended(rec.Response.Status) {
			break
		}
		rec.Response = end
		rec.Body = nil
		if _, err = r.s.update(ctx, rec, rev); err == nil {
			break
		}
		if rec, rev, err = r.s.get(ctx, id); err != nil {
			break
		}
	}
	if gen != nil {
		r.usage(rec, gen.Resp)
	}
	_ = m.Ack()
}

func (r *Runner) generate(ctx context.Context, rec *Record, gen *Gen) error {
	if gen.Seq() == 0 {
		if err := gen.Begin(); err != nil {
			return err
		}
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
		Model: rec.Response.Model, Body: body, Deadline: deadline, Tenant: rec.Tenant})
	var e *schemas.Error
	if errors.As(err, &e) {
		return gen.End(e) // failed before any token: in band, as the response's error
	}
	return err
}

func (r *Runner) usage(rec *Record, resp *Response) {
	if r.cfg.OnUsage == nil || resp.Usage == nil {
		return
	}
	r.cfg.OnUsage(schemas.UsageRecord{RequestID: resp.ID, KeyID: rec.KeyID, Tenant: rec.Tenant, Model: resp.Model,
		Usage: schemas.Usage{PromptTokens: resp.Usage.InputTokens, CompletionTokens: resp.Usage.OutputTokens,
			TotalTokens: resp.Usage.TotalTokens}, Reserved: rec.Reserved, Window: rec.Window})
}

func itoa(n int) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}
