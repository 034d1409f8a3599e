package workers

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// call is one admitted request: its context and its reply stream. It is the
// engine's Sink.
type call struct {
	w      *Worker
	req    engine.Request
	reply  string
	ctx    context.Context
	cancel context.CancelCauseFunc
	span   trace.Span // "generate <model>"; finish ends it
	// released: its slot is freed and its done notice sent (Worker.release);
	// only the goroutine serving it touches this.
	released bool

	adapterBase, adapterPath string // HdrAdapterBase, HdrAdapterPath: a LoRA adapter to load if the engine lacks it
	cancelToken              string // HdrCancelToken: a cancel must carry it
	usage                    usageMark
	prefix                   prefixPrediction // HdrPrefixCached: what the dispatcher predicts the engine holds of the prompt
	// Disaggregation (disagg.go): prefillWorker (HdrPrefillWorker) is to
	// run this request's prefill; prefillFor (HdrPrefill): this is another
	// worker's prefill; remote is set once the prefill's params are in.
	prefillWorker string
	prefillFor    bool
	remote        *remote

	start      time.Time     // admission
	firstChunk bool          // a chunk was sent (for TTFT)
	prefill    time.Duration // admission to the first chunk: the prompt's prefill, for the done notice
	completed  bool          // the done frame was sent (else the done notice says failed)
	used       schemas.Usage // of a completed request, for the done notice (flow control's cost)

	mu        sync.Mutex
	seq       uint64
	buf       []byte // reused frame buffer: Publish copies it
	lastSend  time.Time
	lastChunk time.Time // when the last chunk frame went out
	pending   []byte    // chunk lines held back (see Chunks), '\n'-separated
	lingering bool      // c is on the worker's linger list
	ended     bool

	mux   *outbox  // the client takes multiplexed replies: every frame goes through it
	local Receiver // the client is in this process: every frame goes to it in memory
	token string   // last token of the reply subject, for mux entries and local frames
}

func (w *Worker) newCall(m *nats.Msg, prefill bool) (*call, error) {
	c := &call{w: w, reply: m.Reply, start: time.Now()}
	c.local, c.token = w.localReceiver(m.Reply) // in memory: neither batched nor split
	if c.local == nil && m.Header.Get(schemas.HdrMux) == "1" {
		if prefix, token, ok := schemas.SplitReply(m.Reply); ok {
			c.mux, c.token = w.outboxFor(prefix), token
		}
	}
	h := m.Header
	c.req = engine.Request{
		ID:          h.Get(schemas.HdrRequestID),
		Kind:        schemas.Kind(h.Get(schemas.HdrKind)),
		Model:       h.Get(schemas.HdrModel),
		Body:        m.Data,
		Deadline:    schemas.ParseDeadline(h.Get(schemas.HdrDeadline)),
		TraceParent: h.Get(schemas.HdrTrace),
		TokenIDs:    h.Get(schemas.HdrTokenIDs) == "1",
	}
	if v := h.Get(schemas.HdrBand); v != "" {
		if b, ok := schemas.ParseBand(v); ok {
			c.req.Band = b
		}
	}
	if v := h.Get(schemas.HdrResume); v != "" { // usually absent: Atoi("") allocates its error
		c.req.Resume, _ = strconv.Atoi(v)
	}
	c.adapterBase, c.adapterPath = h.Get(schemas.HdrAdapterBase), h.Get(schemas.HdrAdapterPath)
	c.cancelToken = h.Get(schemas.HdrCancelToken)
	c.usage = readUsageMark(h)
	c.prefix = readPrefixPrediction(h)
	parent := w.startSpan(c, m)
	var stop context.CancelFunc = func() {}
	if !c.req.Deadline.IsZero() {
		parent, stop = context.WithDeadline(parent, c.req.Deadline)
	}
	ctx, cancel := context.WithCancelCause(parent)
	c.ctx = ctx
	c.cancel = func(cause error) { cancel(cause); stop() }
	switch {
	case !schemas.ValidRequestID(c.req.ID):
		return c, schemas.ErrBadHeader.New(schemas.HdrRequestID)
	case !c.req.Kind.Valid():
		return c, schemas.ErrBadHeader.New(schemas.HdrKind)
	case c.req.Model == "":
		return c, schemas.ErrBadHeader.At("model", schemas.HdrModel)
	case !c.req.Deadline.IsZero() && time.Now().After(c.req.Deadline):
		return c, schemas.ErrDeadlinePassed.New("before a worker took it")
	}
	// The body is read here once, by the reader every process uses; the
	// engine decides on this view (a gateway has checked the body already,
	// a NATS-native client's gets its 400 here). Tb-Model, which the
	// dispatcher set from the subject, is the model: a body naming another
	// is model_mismatch.
	view, rerr := schemas.ReadRequestFor(c.req.Kind, m.Data, c.req.Model)
	if rerr != nil {
		return c, rerr
	}
	c.req.View = view
	if err := c.readDisagg(h, prefill); err != nil {
		return c, err
	}
	w.mu.Lock()
	if _, dup := w.inflight[c.key()]; dup {
		w.mu.Unlock()
		return c, schemas.ErrDuplicateRequest.New(c.req.ID)
	}
	w.inflight[c.key()] = c
	w.mu.Unlock()
	return c, nil
}

// key is the call's entry in the worker's table: its request id and cancel
// token. A client that sends a request again after losing its stream (a
// retry or a migration: same id, a new token) may reach this worker while
// the first attempt still runs here, and must not be refused as a duplicate;
// a cancel names both, so it stops only the attempt it was given for.
func (c *call) key() string { return inflightKey(c.req.ID, c.cancelToken) }

func inflightKey(id, cancelToken string) string { return id + " " + cancelToken }

// Chunks implements engine.Sink.
func (c *call) Chunks(b []byte) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	first := !c.firstChunk // a stream's first chunk is never held back
	if first {             // engines call Chunks from one goroutine per request
		c.firstChunk = true
		c.prefill = time.Since(c.start)
		c.w.m.ttft.Observe(c.prefill.Seconds())
		c.span.AddEvent(tracing.EventFirstToken)
		c.remoteFirstChunk()
	}
	linger := c.w.cfg.ChunkLinger
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return context.Canceled
	}
	now := time.Now()
	// A chunk goes out at once unless the previous one left less than
	// ChunkLinger ago: then it waits, at most that long, for more to share
	// its message. A trickle of tokens (a real model's) is never delayed;
	// a flood (a fast engine, a burst) costs one message per ChunkLinger per
	// stream instead of one per token, which is most of the bus's CPU.
	if c.mux != nil || len(c.pending) == 0 && (linger <= 0 || now.Sub(c.lastChunk) >= linger) {
		c.lastChunk = now
		return c.publishLocked(schemas.FrameChunk, b, now, first)
	}
	if c.pending == nil {
		c.pending = getPending()
	}
	if len(c.pending) > 0 {
		c.pending = append(c.pending, '\n')
	}
	c.pending = append(c.pending, b...)
	if len(c.pending) >= maxPending {
		return c.flushLocked(now)
	}
	if !c.lingering {
		c.lingering = true
		c.w.linger(c)
	}
	return nil
}

// maxPending bounds the chunk bytes a stream holds back (and one message's size).
const maxPending = 64 << 10

// pendingPool keeps the buffers of held-back chunks between streams: a
// stream that grows its own, up to tens of kilobytes under a fast engine,
// was most of a worker's allocated bytes. A buffer goes back when its stream
// ends (every frame copies what it sends).
var pendingPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

func getPending() []byte { return (*pendingPool.Get().(*[]byte))[:0] }

// putPendingLocked gives the stream's buffer back; the stream has ended.
func (c *call) putPendingLocked() {
	if b := c.pending; b != nil && cap(b) <= 2*maxPending {
		c.pending = nil
		pendingPool.Put(&b)
	}
}

// flushLocked publishes the held-back chunks, if any.
func (c *call) flushLocked(now time.Time) error {
	if len(c.pending) == 0 {
		return nil
	}
	c.lastChunk = now
	err := c.publishLocked(schemas.FrameChunk, c.pending, now, false)
	c.pending = c.pending[:0]
	return err
}

// flushLinger is the worker's linger timer firing for c.
func (c *call) flushLinger() {
	c.mu.Lock()
	c.lingering = false
	if !c.ended {
		_ = c.flushLocked(time.Now())
	}
	c.mu.Unlock()
}

func (c *call) send(t schemas.FrameType, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return context.Canceled
	}
	now := time.Now()
	if err := c.flushLocked(now); err != nil { // held-back chunks go first
		return err
	}
	if t.Terminal() {
		c.ended = true
		c.putPendingLocked()
	}
	return c.publishLocked(t, payload, now, false)
}

// publishLocked sends one frame, as parts if its payload is over the
// connection's limit; urgent (a stream's first chunk) is not held back in a
// multiplexed outbox. A frame that cannot be sent fails the request (see
// publishFailedLocked): the stream would have a hole the client cannot see.
func (c *call) publishLocked(t schemas.FrameType, payload []byte, now time.Time, urgent bool) error {
	if size := int(c.w.partSize.Load()); len(payload) > size && c.local == nil {
		for len(payload) > size {
			if err := c.publishOneLocked(schemas.FramePart, payload[:size], now, urgent); err != nil {
				return c.publishFailedLocked(t, err)
			}
			payload = payload[size:]
		}
	}
	if err := c.publishOneLocked(t, payload, now, urgent); err != nil {
		return c.publishFailedLocked(t, err)
	}
	return nil
}

// publishFailedLocked handles a frame that could not be published: the
// request ends (its engine work is cancelled), the client is told with an
// error frame if that can still go out, and the failure is counted.
func (c *call) publishFailedLocked(t schemas.FrameType, err error) error {
	c.w.m.publishErrors.Inc()
	c.w.log.Warn("reply frame not sent; failing the request", "request_id", c.req.ID, "frame", t, "err", err)
	e := schemas.ErrReplyNotSent.New(t, err)
	if !c.ended {
		c.ended = true
		c.seq++
		// Straight to the stream's subject, past the outbox: it is small,
		// and whatever failed there must not hold it. (A local receiver
		// never fails.)
		if c.w.nc.Publish(c.reply, schemas.AppendFrame(c.buf[:0], schemas.FrameError, c.seq, e.Payload())) != nil {
			c.w.m.publishErrors.Inc()
		}
	}
	c.cancel(e)
	return e
}

func (c *call) publishOneLocked(t schemas.FrameType, payload []byte, now time.Time, urgent bool) error {
	c.seq++
	c.lastSend = now
	if c.local != nil { // the receiver keeps the frame: a new one each time
		c.local.Deliver(c.token, schemas.AppendFrame(make([]byte, 0, len(t)+22+len(payload)), t, c.seq, payload))
		return nil
	}
	c.buf = schemas.AppendFrame(c.buf[:0], t, c.seq, payload)
	if c.mux != nil {
		return c.mux.add(c.reply, c.token, c.buf, urgent, now)
	}
	return c.w.nc.Publish(c.reply, c.buf)
}

func (c *call) sendAccepted() {
	var buf [256]byte
	b := schemas.AppendAccepted(buf[:0], schemas.Accepted{RequestID: c.req.ID, Worker: c.w.cfg.ID, Cancel: c.w.cancelSubject,
		CancelToken: c.cancelToken})
	_ = c.send(schemas.FrameAccepted, b)
}

// sendError ends the stream with an error (a no-op if it has ended).
func (c *call) sendError(e *schemas.Error) { _ = c.send(schemas.FrameError, e.Payload()) }

// keepalive sends a keepalive if the stream has been silent for d.
func (c *call) keepalive(now time.Time, d time.Duration) {
	c.mu.Lock()
	silent := !c.ended && c.seq > 0 && now.Sub(c.lastSend) >= d
	c.mu.Unlock()
	if silent {
		_ = c.send(schemas.FrameKeepalive, nil)
	}
}

// lingerer holds frames back for at most ChunkLinger: a stream (call) or a
// client's outbox.
type lingerer interface{ flushLinger() }

// linger puts l on the list the linger loop flushes.
func (w *Worker) linger(l lingerer) {
	w.lingerMu.Lock()
	w.lingering = append(w.lingering, l)
	w.lingerMu.Unlock()
	select {
	case w.lingerKick <- struct{}{}:
	default:
	}
}

// lingerLoop flushes held-back chunks: one timer for all streams, armed only
// while some stream holds chunks back.
func (w *Worker) lingerLoop(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	var held []lingerer
	flush := func() {
		w.lingerMu.Lock()
		held, w.lingering = w.lingering, held[:0]
		w.lingerMu.Unlock()
		for i, l := range held {
			l.flushLinger()
			held[i] = nil
		}
	}
	for {
		select {
		case <-stop:
			flush()
			return
		case <-w.lingerKick:
		}
		t.Reset(w.cfg.ChunkLinger)
		select {
		case <-stop:
			t.Stop()
			flush()
			return
		case <-t.C:
		}
		flush()
	}
}
