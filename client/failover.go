package client

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// Failover: a stream whose worker fails is sent again to another worker,
// transparently, at most Options.MigrationLimit times.
//
//   - Before its first content chunk reached the reader, a retry: the same
//     body again.
//   - After it, a migration: a continuation (continuation.go) of what was
//     streamed, whose output is spliced (splice.go) so that the reader sees
//     one stream: same id, created and model, no token lost or repeated,
//     usage over the whole completion.
//
// Every attempt has a new reply token (frames of an earlier attempt land
// nowhere: a late accepted frame is cancelled as for a closed stream) and a
// new cancel token, and carries schemas.HdrExclude with the workers that
// failed it. The failed attempt is cancelled at its worker, best effort.
//
// What fails a worker: the client's own findings (WorkerLost, a gap in the
// numbering, a stall) and the error frames of a worker that refused or lost
// the request (retryable). Anything else (a 4xx, a timeout, an overflow of a
// slow reader, a full queue) ends the stream as before.

// Failover kinds, for Options.OnFailover.
const (
	FailoverRetry     = "retry"            // sent again before any content
	FailoverMigration = "migration"        // continued elsewhere mid-stream
	FailoverFailed    = "migration_failed" // could not be sent again: the stream fails
)

// Reasons a stream is sent again: the client's own, and the codes of the
// error frames that are retryable.
const (
	ReasonWorkerLost = "worker_lost"   // WorkerLost: heartbeats or NATS say the worker is gone
	ReasonGap        = "stream_gap"    // a frame was lost
	ReasonSilent     = "worker_silent" // stall: no frame for the stall timeout
	// ReasonDispatcherGone: the dispatcher holding the request in its
	// queue stopped beating (schemas.Queued BeatMS): it died.
	ReasonDispatcherGone = "dispatcher_gone"
)

// retryable is the reason for an error frame that another worker may not
// have: the worker is shutting down (shutting_down), full (worker_busy), its
// engine is down (engine_unhealthy) or cut the stream before it finished
// (engine_stream_truncated: a server that ends a running stream when
// another request arrives). Everything else in the catalogue is
// about the request (4xx), the fleet as a whole (no_worker, queue_full) or
// time (timeout), which another attempt would not change. "" for those.
func retryable(e *schemas.Error) string {
	if e == nil || e.Body.Code == nil {
		return ""
	}
	if code := *e.Body.Code; slices.Contains(retryableCodes, code) {
		return code
	}
	return ""
}

var retryableCodes = []string{"shutting_down", "worker_busy", "engine_unhealthy", schemas.CodeEngineTruncated}

// Reasons are every Failover.Reason there is, for metrics that show each
// from start-up (at 0).
func Reasons() []string {
	return append([]string{ReasonWorkerLost, ReasonGap, ReasonSilent, ReasonDispatcherGone}, retryableCodes...)
}

// Failover is one event of a stream's failover, for metrics.
type Failover struct {
	Kind      string // FailoverRetry, FailoverMigration or FailoverFailed
	Reason    string // ReasonWorkerLost, ReasonGap, ReasonSilent, or a retryable error code
	RequestID string
	Worker    string // the worker that failed, if known
	Tokens    int    // migration: completion tokens already streamed
	Why       string // FailoverFailed: why it could not be sent again
}

// failover is a stream's failover state. Only the stream's reader (Next)
// uses it, so the per-token work is an append, without locks.
type failover struct {
	attempts  int
	exclude   []string
	delivered int // chunk frames returned to the reader
	// kept are their payloads, for a continuation. Kept by reference, not
	// copied: a payload is part of a message nats.go allocated for us alone
	// and nobody writes to it (a copy doubled the bytes a stream allocates).
	kept [][]byte
	over bool    // more than MigrationMaxSeqLen: cannot be continued
	sp   *splice // set once migrated

	// Token ids (tokenids.go): whether the stream's chunks carry them, the
	// prompt's (the first attempt's) and the generated tokens', and whether
	// the reader gets them as null (it did not ask). badIDs: ids that could
	// not be read; the stream is continued from its text.
	ids         idState
	tokenIDs    bool // the request carries schemas.HdrTokenIDs
	strip       bool
	badIDs      bool
	prompt, gen []int32
	lay         schemas.ChunkLayout // scratch
	edits       []edit              // scratch
}

// pass is what Next does with a content frame before returning it: keep a
// chunk for a continuation, and after a migration splice it (false: drop it,
// the reader has it already).
func (fo *failover) pass(s *Stream, f schemas.Frame) (schemas.Frame, bool) {
	switch f.Type {
	case schemas.FrameChunk:
		switch {
		case fo.sp != nil:
			if f.Payload = fo.sp.chunk(fo, f.Payload); len(f.Payload) == 0 {
				return f, false
			}
		case fo.ids != idsOff:
			if f.Payload = fo.tokens(f.Payload, s.req.Kind == schemas.KindChat); len(f.Payload) == 0 {
				return f, false
			}
		}
		fo.delivered++
		if s.c.opts.MigrationLimit > 0 && !fo.over {
			if len(fo.kept) >= s.c.opts.MigrationMaxSeqLen {
				fo.over, fo.kept = true, nil
			} else {
				if fo.kept == nil {
					fo.kept = make([][]byte, 0, 16) // fewer regrowths on a long stream; small for a short one
				}
				fo.kept = append(fo.kept, f.Payload)
			}
		}
	case schemas.FrameDone:
		if fo.sp != nil {
			f.Payload = fo.sp.done(f.Payload)
		}
	}
	return f, true
}

// retryBackoff is the wait before the second attempt of a stream; it
// doubles for each further one.
const retryBackoff = 250 * time.Millisecond

// failover sends the stream again after err (why: the client's own reason,
// or "" for an error frame) if it may; false: the stream fails with err.
func (s *Stream) failover(ctx context.Context, err error, why string) bool {
	e, _ := err.(*schemas.Error)
	reason := why
	if reason == "" {
		reason = retryable(e)
	}
	if reason == "" {
		return false
	}
	o := &s.c.opts
	migrate := s.fo.delivered > 0
	worker := s.Worker()
	ev := Failover{Kind: FailoverRetry, Reason: reason, RequestID: s.id, Worker: worker}
	if o.MigrationLimit < 0 || s.fo.attempts >= o.MigrationLimit {
		ev.Kind, ev.Why = FailoverFailed, "migration limit reached"
		if o.MigrationLimit < 0 {
			ev.Why = "migration off"
		}
		s.c.failoverEvent(ev)
		return false
	}
	body, kind, resume := s.req.Body, s.req.Kind, 0
	var sp *splice
	if migrate {
		ct, cerr := s.fo.continuation(&s.req)
		if cerr != "" {
			ev.Kind, ev.Why = FailoverFailed, cerr
			s.c.failoverEvent(ev)
			return false
		}
		body, kind, resume, sp = ct.body, ct.kind, ct.tokens, ct.splice
		ev.Kind, ev.Tokens = FailoverMigration, ct.tokens
	}
	if worker != "" && !slices.Contains(s.fo.exclude, worker) {
		s.fo.exclude = append(s.fo.exclude, worker)
	}
	if s.fo.attempts > 0 {
		// The first attempt goes at once (a dead worker: another takes it);
		// a second failure in a row suggests something shared (NATS
		// restarting, workers reconnecting): give it a moment, 250 ms
		// then 500 ms, rather than spend the limit in a few milliseconds.
		t := time.NewTimer(min(retryBackoff<<(s.fo.attempts-1), 4*retryBackoff))
		select {
		case <-t.C:
		case <-ctx.Done(): // the reader gave up: so does the stream
			t.Stop()
			ev.Kind, ev.Why = FailoverFailed, "reader gone"
			s.c.failoverEvent(ev)
			return false
		}
	}
	if !s.resend(body, kind, resume) {
		return false
	}
	s.fo.attempts++
	if sp != nil {
		s.fo.sp = sp
	}
	s.c.failoverEvent(ev)
	return true
}

func (c *Client) failoverEvent(ev Failover) {
	lvl := "stream sent again"
	if ev.Kind == FailoverFailed {
		lvl = "stream could not be sent again"
	}
	c.opts.Logger.Info(lvl, "kind", ev.Kind, "reason", ev.Reason, "request_id", ev.RequestID, "worker", ev.Worker,
		"tokens", ev.Tokens, "why", ev.Why)
	if c.opts.OnFailover != nil {
		c.opts.OnFailover(ev)
	}
}

// resend starts the next attempt, a request of kind with body: a new reply
// token and cancel token, the stream's state as after Start; the failed
// attempt is cancelled. false: the stream or the client was closed
// meanwhile.
func (s *Stream) resend(body []byte, kind schemas.Kind, resume int) bool {
	c := s.c
	tok := nuid.Next()
	cancelToken := schemas.NewCancelToken()
	h := s.req.Header()
	h[schemas.HdrKind] = []string{string(kind)}
	if s.fo.tokenIDs {
		h[schemas.HdrTokenIDs] = []string{"1"}
	}
	h[schemas.HdrCancelToken] = []string{cancelToken}
	if len(s.fo.exclude) > 0 {
		h[schemas.HdrExclude] = []string{strings.Join(s.fo.exclude, ",")}
	}
	if resume > 0 {
		h[schemas.HdrResume] = []string{strconv.Itoa(resume)}
	}

	c.mu.Lock()
	if c.streams == nil {
		c.mu.Unlock()
		return false
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.mu.Unlock()
		return false
	}
	oldCancel, oldToken := s.cancel, s.cancelToken
	delete(c.streams, s.tok)
	s.tok = tok
	c.streams[tok] = s
	s.epoch++ // route looks streams up under c.mu: frames of the old attempt are dropped from now on
	s.pending, s.head = nil, 0
	s.failed, s.lost, s.finished = nil, "", false
	s.worker, s.cancel, s.cancelToken, s.queued = "", "", cancelToken, false
	s.stallFor, s.nextSeq, s.last = c.opts.FirstFrameTimeout, 1, time.Now()
	s.mu.Unlock()
	c.mu.Unlock()

	// The failed attempt, best effort: a worker that is alive after all
	// (a stall, a gap) stops generating for nobody.
	if oldCancel != "" {
		_ = c.nc.Publish(oldCancel, schemas.CancelBody(s.id, oldToken))
	} else {
		_ = c.nc.Publish(schemas.QueueCancel, schemas.CancelBody(s.id, oldToken))
	}
	if s.timer != nil { // it may have fired and been drained: arm it for this attempt
		s.timer.Reset(c.opts.FirstFrameTimeout)
	}
	subject := schemas.ReqSubject(s.req.Model)
	if c.opts.KeyID != "" {
		subject = schemas.TenantReqSubject(c.opts.KeyID, s.req.Model)
	}
	msg := &nats.Msg{Subject: subject, Reply: c.prefix + tok, Header: h, Data: body}
	send := c.nc.PublishMsg
	if c.opts.Submit != nil {
		send = c.opts.Submit
	}
	if err := send(msg); err != nil {
		s.fail(schemas.ErrPublish.New(err)) // Next returns it: a publish error is not retried
	}
	return true
}
