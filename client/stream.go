package client

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Stream is the reply stream of one request. Next is for one reader at a time.
type Stream struct {
	c   *Client
	tok string
	id  string // the request id

	mu      sync.Mutex
	pending []schemas.Frame // frames not yet read start at head
	head    int
	last    time.Time     // when the last frame arrived (for the stall timer)
	notify  chan struct{} // cap 1: "pending changed"
	failed  *schemas.Error
	worker  string
	cancel  string // worker's cancel subject, once accepted
	// cancelToken proves our cancels are ours (schemas.CancelBody): the one
	// Start set, until a queued or accepted frame names the one a
	// dispatcher set instead.
	cancelToken string
	queued      bool
	queueInfo   schemas.Queued // the latest queued frame's
	stallFor    time.Duration
	nextSeq     uint64 // next expected worker sequence number
	finished    bool   // a terminal frame was delivered
	closed      bool

	timer *time.Timer

	// Direct delivery (Direct): while the reader waits in Next with nothing
	// queued (parked), the delivering goroutine hands chunks to direct
	// itself; flushDue asks the reader to finish what direct could not send.
	direct   DirectWriter
	parked   bool
	flushDue bool

	begun atomic.Bool // a chunk (or the end) was pushed

	// Failover (failover.go). epoch counts the attempts; it changes with
	// tok under both the client's and the stream's lock, and frames of an
	// earlier attempt are dropped. lost is why the client itself failed the
	// stream (a Reason), "" for anything else.
	epoch uint32
	lost  string
	req   Request // as Start sent it, for a retry or a continuation
	fo    failover
}

func newStream(c *Client, tok, id, cancelToken string) *Stream {
	return &Stream{c: c, tok: tok, id: id, cancelToken: cancelToken, notify: make(chan struct{}, 1),
		stallFor: c.opts.FirstFrameTimeout, nextSeq: 1, last: time.Now()}
}

// ID is the request id.
func (s *Stream) ID() string { return s.id }

// Worker is the id of the worker that accepted the request, or "".
func (s *Stream) Worker() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.worker
}

// acceptedBy is the worker that accepted the request, also when its
// accepted frame has come but the reader has not taken it yet.
func (s *Stream) acceptedBy() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.worker != "" {
		return s.worker
	}
	for _, f := range s.pending[s.head:] {
		if f.Type == schemas.FrameAccepted {
			if acc, ok := schemas.ParseAccepted(f.Payload); ok {
				return acc.Worker
			}
		}
	}
	return ""
}

// Queued reports whether a dispatcher queued the request at some point.
func (s *Stream) Queued() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// HeldForCapacity reports whether the request waits for capacity that is
// not up: its latest queued frame said cold (no live worker served its
// model) and nothing has taken it since.
func (s *Stream) HeldForCapacity() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued && s.worker == "" && s.queueInfo.Cold
}

// QueueEstimate is what the latest queued frame said: the estimated position
// (1: next) and wait (ms; 0: not known) when the request was queued. ok is
// false if it was never queued.
func (s *Stream) QueueEstimate() (position int, waitMS int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queueInfo.Position, s.queueInfo.WaitMS, s.queued
}

func (s *Stream) push(f schemas.Frame, epoch uint32) {
	s.mu.Lock()
	if s.failed != nil || s.finished || epoch != s.epoch {
		s.mu.Unlock()
		return
	}
	switch {
	case f.Seq == 0:
		// dispatcher frames are not numbered
	case f.Seq != s.nextSeq:
		s.failLocked(schemas.ErrStreamGap.New(s.nextSeq, f.Seq))
		s.lost = ReasonGap
		s.mu.Unlock()
		s.wake() // the reader ends the stream now, not at its stall timeout
		return
	default:
		s.nextSeq++
	}
	if len(s.pending)-s.head >= s.c.opts.MaxPending {
		s.failLocked(schemas.ErrStreamOverflow.New())
		s.mu.Unlock()
		s.wake()
		return
	}
	now := time.Now()
	if f.Type == schemas.FrameChunk && s.parked && s.head == len(s.pending) && s.direct != nil &&
		now.Sub(s.last) >= directMinGap && s.direct.Ready(len(f.Payload)) {
		s.last = now
		if out, ok := s.fo.pass(s, f); ok && !s.direct.Write(out.Payload) {
			s.flushDue = true // part of it waits: the reader sends it
		}
		flush := s.flushDue
		s.mu.Unlock()
		s.begun.Store(true)
		if flush {
			s.wake()
		}
		return
	}
	s.pending = append(s.pending, f)
	s.last = now
	s.mu.Unlock()
	if f.Type == schemas.FrameChunk || f.Type.Terminal() {
		s.begun.Store(true)
	}
	s.wake()
}

// directMinGap: a chunk that follows the stream's previous frame sooner
// than this (an engine faster than any model's pace, a backlog) goes the
// reader's way, which sends the chunks that gathered meanwhile in one write;
// written one by one as they came, they cost the client a read each (40 %
// more writes on a zero-latency engine).
const directMinGap = time.Millisecond

// DirectWriter takes a stream's chunks on the goroutine that delivers them
// (see Stream.Direct). Both methods are called with the stream locked and
// must not block.
type DirectWriter interface {
	// Ready reports whether Write may be called now with a payload of n
	// bytes.
	Ready(n int) bool
	// Write sends a chunk's payload, or starts to: false means part of it
	// waits, and Next returns an empty chunk for the reader to send it.
	Write(payload []byte) bool
}

// Direct sets w (nil: none) to take the stream's chunks as they arrive,
// while the reader waits in Next with nothing queued, w is Ready and the
// previous frame came at least directMinGap before: one goroutine hand-off
// less per chunk at a model's pace. Next then returns only what w did not
// take; everything Next does with a chunk (failover's record and splice, the
// stall timer) is done for w's chunks as well. The reader must not use
// what w writes to while it is in Next.
func (s *Stream) Direct(w DirectWriter) {
	s.mu.Lock()
	s.direct = w
	s.mu.Unlock()
}

func (s *Stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Stream) fail(e *schemas.Error) {
	s.mu.Lock()
	s.failLocked(e)
	s.mu.Unlock()
	s.wake()
}

// lose fails the stream for a reason that a retry or a migration may cure.
func (s *Stream) lose(e *schemas.Error, reason string) {
	s.mu.Lock()
	if s.failed == nil && !s.finished {
		s.failed, s.lost = e, reason
	}
	s.mu.Unlock()
	s.wake()
}

func (s *Stream) failLocked(e *schemas.Error) {
	if s.failed == nil && !s.finished {
		s.failed = e
	}
}

// Next returns the next content frame: chunk, then done (the last); queued,
// accepted and keepalive frames are handled here and not returned. Errors:
// an error frame, a lost stream (gap, stall, overflow) or no dispatcher come
// back as *schemas.Error; ctx ending returns ctx.Err(); after done, io.EOF.
func (s *Stream) Next(ctx context.Context) (schemas.Frame, error) {
	for {
		s.mu.Lock()
		if s.finished {
			s.mu.Unlock()
			return schemas.Frame{}, io.EOF
		}
		if s.head < len(s.pending) {
			f := s.pending[s.head]
			s.pending[s.head] = schemas.Frame{}
			s.head++
			if s.head == len(s.pending) { // drained: reuse the array, unless a burst grew it
				s.pending, s.head = s.pending[:0], 0
				if cap(s.pending) > 64 {
					s.pending = nil
				}
			}
			before := s.stallFor
			out, err, ok := s.handleLocked(f)
			if s.stallFor != before && s.timer != nil { // queued or accepted: the timer may now be due sooner
				s.timer.Reset(time.Until(s.last.Add(s.stallFor)))
			}
			s.mu.Unlock()
			if !ok {
				continue
			}
			if err != nil {
				if s.failover(ctx, err, "") {
					continue
				}
				return out, err
			}
			if out, ok = s.fo.pass(s, out); !ok {
				continue // a continuation's chunk the client already has
			}
			return out, nil
		}
		if s.flushDue {
			s.flushDue = false
			s.mu.Unlock()
			return schemas.Frame{Type: schemas.FrameChunk}, nil
		}
		if s.failed != nil {
			err, why := s.failed, s.lost
			s.mu.Unlock()
			if s.failover(ctx, err, why) {
				continue
			}
			s.mu.Lock()
			s.finished = true
			s.mu.Unlock()
			return schemas.Frame{}, err
		}
		stall, last := s.stallFor, s.last
		s.parked = true
		s.mu.Unlock()

		// The stall timer is armed once and re-armed only when it fires
		// early (a frame came since): not reset for every frame, which cost
		// two timer-heap operations per token.
		if s.timer == nil {
			s.timer = time.NewTimer(time.Until(last.Add(stall)))
		}
		select {
		case <-s.notify:
			s.unpark()
		case <-ctx.Done():
			s.unpark()
			return schemas.Frame{}, ctx.Err()
		case <-s.timer.C:
			s.unpark()
			s.mu.Lock() // frames may have come while the timer fired
			idle, stall := time.Since(s.last), s.stallFor
			s.mu.Unlock()
			if idle < stall {
				s.timer.Reset(stall - idle)
				continue
			}
			e := s.stallError()
			reason := ReasonSilent
			if schemas.ErrDispatcherGone.Is(e) {
				reason = ReasonDispatcherGone
			}
			if schemas.ErrQueueTimeout.Is(e) && s.Queued() {
				reason = "" // a full fleet: sending again would only queue again
			}
			s.lose(e, reason)
		}
	}
}

// unpark ends the reader's wait: once it holds the lock, no direct write is
// in progress or can start.
func (s *Stream) unpark() {
	s.mu.Lock()
	s.parked = false
	s.mu.Unlock()
}

// Buffered reports whether Next would return without waiting; a writer uses
// it to flush once per burst instead of once per frame.
func (s *Stream) Buffered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head < len(s.pending) || s.failed != nil || s.flushDue
}

func (s *Stream) stallError() *schemas.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.worker != "":
		return schemas.ErrWorkerSilent.New(s.worker, s.stallFor)
	case s.queued && s.queueInfo.BeatMS > 0:
		return schemas.ErrDispatcherGone.New(s.stallFor)
	case s.queued:
		return schemas.ErrQueueTimeout.New("the request")
	}
	return schemas.ErrDispatcherSilent.New(s.stallFor)
}

// handleLocked processes one frame; ok says whether to return it.
func (s *Stream) handleLocked(f schemas.Frame) (schemas.Frame, error, bool) {
	switch f.Type {
	case schemas.FrameQueued:
		s.queued = true
		var q schemas.Queued
		if json.Unmarshal(f.Payload, &q) == nil && q.TimeoutMS > 0 {
			s.stallFor = time.Duration(q.TimeoutMS)*time.Millisecond + s.c.opts.StallTimeout
			if q.BeatMS > 0 {
				// The dispatcher sends this frame again every beat while
				// the request waits: a few beats of silence mean it died
				// (and the request is sent again), not minutes of them.
				s.stallFor = min(s.stallFor, beatStall(time.Duration(q.BeatMS)*time.Millisecond))
			}
		}
		s.queueInfo = q
		if q.CancelToken != "" {
			s.cancelToken = q.CancelToken
		}
		return f, nil, false
	case schemas.FrameAccepted:
		if acc, ok := schemas.ParseAccepted(f.Payload); ok {
			s.worker, s.cancel = acc.Worker, acc.Cancel
			if acc.CancelToken != "" {
				s.cancelToken = acc.CancelToken
			}
		}
		s.stallFor = s.c.opts.StallTimeout
		return f, nil, false
	case schemas.FrameKeepalive:
		return f, nil, false
	case schemas.FrameChunk:
		return f, nil, true
	case schemas.FrameDone:
		s.finished = true
		return f, nil, true
	case schemas.FrameError:
		s.finished = true
		return schemas.Frame{}, schemas.ParseErrorPayload(f.Payload), true
	}
	return f, nil, false
}

// Close releases the stream. If the request has not finished, it is cancelled:
// at its worker once one accepted it, otherwise in every dispatcher's queue.
func (s *Stream) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	done := s.finished && s.failed == nil
	// Frames pushed but not read yet may say where the request is now.
	for _, f := range s.pending[s.head:] {
		if f.Type == schemas.FrameQueued || f.Type == schemas.FrameAccepted {
			s.handleLocked(f)
		}
	}
	cancel, token, tok := s.cancel, s.cancelToken, s.tok
	s.mu.Unlock()
	s.c.remove(tok)
	if done {
		return
	}
	if cancel != "" {
		_ = s.c.nc.Publish(cancel, schemas.CancelBody(s.id, token))
	} else {
		_ = s.c.nc.Publish(schemas.QueueCancel, schemas.CancelBody(s.id, token))
	}
}

// beatStall is how long a queued request's client waits for its
// dispatcher's next beat before it takes the dispatcher for dead: four
// beats, and never under 3s (a busy machine delays a beat or two).
func beatStall(beat time.Duration) time.Duration { return max(4*beat, 3*time.Second) }
