package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/gateway/httpstream"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

// exchange is one completion request from publish to its end. It holds all
// the stream writer needs: the writer runs after the handler returned, when
// Fiber has recycled the fiber.Ctx, and must never touch it.
type exchange struct {
	g      *Gateway
	id     string
	route  string // route pattern, for metrics
	model  string
	label  string // model as a metric label
	caller Principal
	start  time.Time

	st     *client.Stream
	span   trace.Span      // the server span (no-op with tracing off)
	ctx    context.Context // ends on client gone, shutdown cut or deadline (see Cause)
	cancel context.CancelCauseFunc
	stopDL context.CancelFunc
	w      *httpstream.Watcher

	writeFailed bool // the stream writer could not write: the client is gone
	holding     bool // the stream began before its first token, held for capacity (hold.go)
}

// completions handles POST .../chat/completions and .../completions, and
// the requests that answer one JSON object without generating (embeddings,
// tokenize, detokenize), which take its stream:false path: the same
// routing, limits, usage, deadline and cancel on disconnect.
func (g *Gateway) completions(kind schemas.Kind, torchServe bool) fiber.Handler {
	return func(c *fiber.Ctx) error {
		start := time.Now()
		id, _ := c.Locals(localID).(string)
		span := startSpan(c, kind, id, start) // observe or the stream writer ends it
		if !isJSON(c.Get(fiber.HeaderContentType)) {
			return errUnsupportedMediaType
		}
		resumable := kind == schemas.KindChat && !torchServe && g.cfg.Responses != nil
		if resumable {
			if rid, after, ok := resumeOf(c); ok {
				return g.resumeChat(c, rid, after) // the body is the stream's: not read again
			}
		}
		pathModel := ""
		if torchServe {
			pathModel = pathParam(c, "model")
		}
		if ce := c.Get(fiber.HeaderContentEncoding); ce != "" && !strings.EqualFold(ce, "identity") {
			return errContentEncoding
		}
		// The raw body: fiber's c.Body() would inflate a compressed one, with
		// no limit on what it inflates to.
		body := c.Request().Body()
		// In the TorchServe form the path names the model, as a subject
		// does on the bus: a body naming another is model_mismatch (a proxy
		// may authorise by path).
		req, perr := schemas.ReadRequestFor(kind, body, pathModel)
		if perr != nil {
			return perr
		}
		known := g.cat.Known(req.Model)
		label := "unknown"
		if known {
			label = req.Model
		}
		c.Locals(localModel, req.Model)
		c.Locals(localLabel, label)
		if span.IsRecording() {
			span.SetAttributes(attribute.String(tracing.AttrModel, schemas.Clip(g.cfg.Redactor.String(req.Model), schemas.MaxQuoted)), attribute.Bool(tracing.AttrStream, req.Stream))
		}

		var caller Principal
		if g.cfg.Authorize != nil {
			p, err := g.cfg.Authorize(c, req)
			if err != nil {
				return err
			}
			caller = Principal{Tenant: strings.Clone(p.Tenant), KeyID: strings.Clone(p.KeyID),
				Reserved: p.Reserved, Window: p.Window, Band: p.Band, Weight: p.Weight, MaxQueue: p.MaxQueue}
		}
		if !known {
			return schemas.ErrModelNotFound.New(req.Model)
		}
		if resumable && req.Stream && c.Get(HeaderResumable) == "true" {
			return g.startResumable(c, req, caller)
		}

		deadline := start.Add(g.cfg.RequestTimeout)
		x := &exchange{g: g, id: id, route: c.Route().Path, model: req.Model, label: label,
			caller: caller, start: start, span: span}
		var reqCtx context.Context
		reqCtx, x.cancel = context.WithCancelCause(g.base)
		x.ctx, x.stopDL = context.WithDeadlineCause(reqCtx, deadline, g.errTimeout)

		creq := &client.Request{
			ID:        id,
			Kind:      kind,
			Model:     req.Model,
			Body:      payload(req),
			Deadline:  deadline,
			Priority:  req.Priority,
			MaxTokens: req.MaxTokens,
			Trace:     outgoingTrace(span, c.Get("traceparent")),
		}
		g.flow(creq, caller, req.User)
		st, err := g.cl.Start(creq)
		if err != nil {
			x.stopDL()
			x.cancel(nil)
			return err
		}
		g.inflight.add()
		x.st = st
		x.w = g.streams.Watch(c.Context(), st.Buffered, x.cancel, errClientGone)

		if !req.Stream {
			finished := false
			defer func() { x.end(finished) }()
			var out []byte
			out, err = x.unary()
			if err != nil {
				return err
			}
			finished = true
			setQueueHeaders(c, st)
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(fiber.StatusOK).Send(out)
		}

		// Commit to a 200 stream only once the first chunk is there, so that
		// errors before any token keep their real status; unless the
		// request waits for capacity that is not up (hold.go): then after
		// HoldKeepalive the stream begins with SSE comments (x.next).
		first, err := x.first()
		if err == errHeld {
			c.Locals(localStreaming, true)
			setQueueHeaders(c, st)
			c.Status(fiber.StatusOK)
			g.m.activeStreams.Inc()
			s := g.streams.Begin(c.Context(), x.w)
			x.holding = true
			_ = s.Comment(holdComment)
			_ = s.Flush()
			s.Run(x.ctx, func(s *httpstream.Stream) { x.writeStream(s, schemas.Frame{}, time.Time{}, 0) })
			return nil
		}
		if err != nil {
			e := x.fail(err) // before end, which cancels the context
			x.end(false)
			return e
		}
		firstAt := time.Now()
		x.w.Touch(firstAt)
		if span.IsRecording() && first.Type == schemas.FrameChunk {
			span.AddEvent(tracing.EventFirstToken, trace.WithTimestamp(firstAt))
		}

		c.Locals(localStreaming, true)
		setQueueHeaders(c, st)
		c.Status(fiber.StatusOK)
		g.m.activeStreams.Inc()
		// The stream is written straight to the connection (httpstream), each
		// burst in one syscall, and the first chunk from this goroutine: the
		// one that runs the rest waits to be scheduled, which showed in the
		// time to first token on a busy machine.
		s := g.streams.Begin(c.Context(), x.w)
		sent := 0
		if first.Type == schemas.FrameChunk {
			sent, _ = s.WriteEvents(first.Payload)
			if !st.Buffered() {
				_ = s.Flush()
			}
		}
		s.Run(x.ctx, func(s *httpstream.Stream) { x.writeStream(s, first, firstAt, sent) })
		return nil
	}
}

// unary waits for the done frame of a stream:false request and returns its
// payload, the whole OpenAI response object.
func (x *exchange) unary() ([]byte, error) {
	for {
		f, err := x.st.Next(x.ctx)
		if err != nil {
			return nil, x.fail(err)
		}
		x.w.Touch(time.Now())
		if f.Type == schemas.FrameDone {
			x.usage(f.Payload)
			return f.Payload, nil
		}
		// A chunk has no place in a stream:false reply; the done frame has it all.
	}
}

// writeStream is the SSE body writer. It runs in its own goroutine after the
// handler returned (httpstream.Stream.Run): it uses only x, recovers its
// panics (nothing else would), and ends when the stream is done, fails, the
// client goes or the gateway cuts it on shutdown. f is the first frame; if
// it is a chunk, the handler already wrote it, sent events.
func (x *exchange) writeStream(s *httpstream.Stream, f schemas.Frame, firstAt time.Time, sent int) {
	g := x.g
	finished, outcome := false, "done"
	var streamErr error
	defer func() {
		g.streamWriterEnd(recover(), x.id, x.route, x.model, x.label, x.start, x.span, outcome, streamErr)
		x.end(finished)
	}()

	if f.Type == schemas.FrameChunk { // else held for capacity: x.next observes it
		g.m.ttft.WithLabelValues(x.label).Observe(firstAt.Sub(x.start).Seconds())
	}
	// The label's children once per stream: nothing is looked up per token.
	d := &direct{s: s, w: x.w, itl: g.m.itl.WithLabelValues(x.label), chunks: g.m.chunks.WithLabelValues(x.label),
		last: firstAt}
	// Chunks that come while this goroutine waits are written by the one
	// that delivers them, when the socket takes them at once (direct).
	if !x.holding { // held: x.next hands chunks to d from the first token on
		x.st.Direct(d)
	}
	defer x.st.Direct(nil) // before the deferred end above: nothing writes after it
	written := f.Type == schemas.FrameChunk
	for {
		switch f.Type {
		case schemas.FrameChunk:
			var err error
			if written {
				written, err = false, s.Err()
				d.chunks.Add(float64(sent))
			} else {
				var n int
				n, err = s.WriteEvents(f.Payload)
				d.chunks.Add(float64(n))
				if err == nil && !x.st.Buffered() {
					err = s.Flush() // once per burst
				}
			}
			if err != nil {
				x.writeFailed, outcome = true, "client_gone"
				return
			}
		case schemas.FrameDone:
			finished = true
			// Usage is accounted before the client sees [DONE]: once a
			// client has its answer, its usage is counted.
			x.usage(f.Payload)
			_ = s.Done()
			return
		}

		var err error
		held := x.holding
		f, err = x.next(s, d)
		now := time.Now()
		x.w.Touch(now)
		if err != nil {
			e := x.fail(err)
			if e == errClientGone {
				outcome = "client_gone"
				return
			}
			outcome, streamErr = "error", e
			if e.Body.Code != nil {
				outcome = *e.Body.Code
			}
			// Counted as a 200 (its status went out with the first chunk):
			// this is where a stream that failed later is seen.
			g.m.streamErrors.WithLabelValues(x.label, codeLabel(e)).Inc()
			_ = s.Fail(e)
			return
		}
		if f.Type == schemas.FrameChunk && len(f.Payload) > 0 && !held { // empty: the rest of a direct write
			d.itl.Observe(now.Sub(d.last).Seconds())
			d.last = now
		}
	}
}

// streamWriterEnd ends a stream writer, chat's or a Responses stream's,
// after its last frame: a panic it recovered (r) counted and logged, the
// active-streams gauge, the duration, the request's log line and its span.
func (g *Gateway) streamWriterEnd(r any, id, route, model, label string, start time.Time, span trace.Span, outcome string, streamErr error) {
	if r != nil {
		outcome = "panic"
		streamErr = fmt.Errorf("stream writer panic: %v", r)
		g.m.streamErrors.WithLabelValues(label, "internal_error").Inc()
		g.log.Error("stream writer panic", "request_id", id, "trace_id", tracing.TraceID(span), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	}
	g.m.activeStreams.Dec()
	d := time.Since(start)
	g.m.duration.WithLabelValues(route, label).Observe(d.Seconds())
	g.logRequest(id, route, model, fiber.StatusOK, d, fiber.MethodPost, outcome, tracing.TraceID(span))
	if streamErr != nil {
		tracing.Fail(span, streamErr)
	}
	endSpan(span, fiber.StatusOK, nil, outcome)
}

// direct writes a stream's chunks from the goroutine that delivers them
// (client.DirectWriter), while writeStream's goroutine waits in Next: one
// wake of that goroutine less per chunk. A payload of up to maxDirect bytes
// is written only when the socket takes it without waiting; what it does
// not take, writeStream sends.
type direct struct {
	s      *httpstream.Stream
	w      *httpstream.Watcher
	itl    prometheus.Observer
	chunks prometheus.Counter
	last   time.Time // the last chunk, for the inter-token latency; shared with writeStream
}

// maxDirect keeps a direct write within one burst of the stream's buffer,
// so that adding it never makes the stream flush (and wait).
const maxDirect = 16 << 10

func (d *direct) Ready(n int) bool { return n <= maxDirect && d.s.Ready() }

func (d *direct) Write(payload []byte) bool {
	now := time.Now()
	n, _ := d.s.WriteEvents(payload)
	d.chunks.Add(float64(n))
	d.itl.Observe(now.Sub(d.last).Seconds())
	d.last = now
	d.w.Touch(now)
	return d.s.TryFlush()
}

// fail maps an error of Stream.Next. When the request's own context ended,
// its cause says why: errClientGone, the shutdown cut or the deadline.
func (x *exchange) fail(err error) *schemas.Error {
	var e *schemas.Error
	if errors.As(err, &e) {
		return e
	}
	if x.ctx.Err() != nil {
		return schemas.AsError(context.Cause(x.ctx))
	}
	return schemas.AsError(err)
}

// end releases everything; finished says the request got its done frame.
// Closing an unfinished stream cancels it at its worker or in the queues.
func (x *exchange) end(finished bool) {
	x.w.Stop()
	if !finished && (x.writeFailed || x.w.Gone()) {
		x.g.m.disconnects.Inc()
	}
	x.st.Close()
	x.stopDL()
	x.cancel(nil)
	x.g.inflight.done()
}

// usage counts the done payload's usage in tokens_total and hands its
// record to OnUsage. A panicking hook is logged; it must not break the response.
func (x *exchange) usage(done []byte) {
	var u schemas.Usage
	if p := schemas.UsageOf(done); p != nil {
		u = *p
	}
	if u.PromptTokens > 0 {
		x.g.m.tokens.WithLabelValues(x.label, "prompt").Add(float64(u.PromptTokens))
	}
	if u.CompletionTokens > 0 {
		x.g.m.tokens.WithLabelValues(x.label, "completion").Add(float64(u.CompletionTokens))
	}
	if x.g.cfg.OnUsage == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			x.g.log.Error("OnUsage panicked", "request_id", x.id, "trace_id", tracing.TraceID(x.span), "panic", fmt.Sprint(r))
		}
	}()
	x.g.cfg.OnUsage(schemas.UsageRecord{RequestID: x.id, KeyID: x.caller.KeyID, Tenant: x.caller.Tenant,
		Model: x.model, Usage: u, Reserved: x.caller.Reserved, Window: x.caller.Window})
}

// pathParam is a route parameter, unescaped and copied out of fasthttp's buffers.
func pathParam(c *fiber.Ctx, name string) string {
	v := c.Params(name)
	if u, err := url.PathUnescape(v); err == nil {
		v = u
	}
	return strings.Clone(v) // PathUnescape returns v itself when there is nothing to unescape
}

// traceParent passes a W3C traceparent on if it is well formed.
func traceParent(v string) string {
	if len(v) != 55 {
		return ""
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '-') {
			return ""
		}
	}
	return strings.Clone(v)
}
