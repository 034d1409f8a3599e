package workers

import (
	"context"
	"encoding/json"
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

	adapterBase, adapterPath string // HdrAdapterBase, HdrAdapterPath: a LoRA adapter to load if the engine lacks it

	start      time.Time // admission
	firstChunk bool      // a chunk was sent (for TTFT)

	mu       sync.Mutex
	seq      uint64
	buf      []byte // reused frame buffer: Publish copies it
	lastSend time.Time
	ended    bool
}

func (w *Worker) newCall(m *nats.Msg) (*call, error) {
	c := &call{w: w, reply: m.Reply, start: time.Now()}
	h := m.Header
	c.req = engine.Request{
		ID:          h.Get(schemas.HdrRequestID),
		Kind:        schemas.Kind(h.Get(schemas.HdrKind)),
		Model:       h.Get(schemas.HdrModel),
		Body:        m.Data,
		Deadline:    schemas.ParseDeadline(h.Get(schemas.HdrDeadline)),
		TraceParent: h.Get(schemas.HdrTrace),
	}
	c.adapterBase, c.adapterPath = h.Get(schemas.HdrAdapterBase), h.Get(schemas.HdrAdapterPath)
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
		return c, schemas.BadRequest("", "missing or invalid %s header", schemas.HdrRequestID)
	case !c.req.Kind.Valid():
		return c, schemas.BadRequest("", "missing or invalid %s header", schemas.HdrKind)
	case c.req.Model == "":
		return c, schemas.BadRequest("model", "missing %s header", schemas.HdrModel)
	case !c.req.Deadline.IsZero() && time.Now().After(c.req.Deadline):
		return c, schemas.Timeout("the request's deadline passed before a worker took it")
	}
	w.mu.Lock()
	if _, dup := w.inflight[c.req.ID]; dup {
		w.mu.Unlock()
		return c, schemas.BadRequest("", "request id %q is already running on this worker", c.req.ID)
	}
	w.inflight[c.req.ID] = c
	w.mu.Unlock()
	return c, nil
}

// Chunks implements engine.Sink.
func (c *call) Chunks(b []byte) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if !c.firstChunk { // engines call Chunks from one goroutine per request
		c.firstChunk = true
		c.w.m.ttft.Observe(time.Since(c.start).Seconds())
		c.span.AddEvent(tracing.EventFirstToken)
	}
	return c.send(schemas.FrameChunk, b)
}

func (c *call) send(t schemas.FrameType, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return context.Canceled
	}
	if t.Terminal() {
		c.ended = true
	}
	c.seq++
	c.buf = schemas.AppendFrame(c.buf[:0], t, c.seq, payload)
	c.lastSend = time.Now()
	return c.w.nc.Publish(c.reply, c.buf)
}

func (c *call) sendAccepted() {
	b, _ := json.Marshal(schemas.Accepted{RequestID: c.req.ID, Worker: c.w.cfg.ID, Cancel: schemas.CancelSubject(c.w.cfg.ID)})
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
