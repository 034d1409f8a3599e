package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/client"
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
	w      *watcher

	writeFailed bool // the stream writer could not write: the client is gone
}

// completions handles POST .../chat/completions and .../completions.
func (g *Gateway) completions(kind schemas.Kind, torchServe bool) fiber.Handler {
	return func(c *fiber.Ctx) error {
		start := time.Now()
		id, _ := c.Locals(localID).(string)
		span := startSpan(c, kind, id, start) // observe or the stream writer ends it
		if !isJSON(c.Get(fiber.HeaderContentType)) {
			return errUnsupportedMediaType
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
		req, perr := schemas.ReadRequest(kind, body, pathModel)
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
			span.SetAttributes(attribute.String(tracing.AttrModel, req.Model), attribute.Bool(tracing.AttrStream, req.Stream))
		}

		var caller Principal
		if g.cfg.Authorize != nil {
			p, err := g.cfg.Authorize(c, req.Model)
			if err != nil {
				return err
			}
			caller = Principal{Tenant: strings.Clone(p.Tenant), KeyID: strings.Clone(p.KeyID)}
		}
		if !known {
			return schemas.ModelNotFound(req.Model)
		}

		deadline := start.Add(g.cfg.RequestTimeout)
		x := &exchange{g: g, id: id, route: c.Route().Path, model: req.Model, label: label,
			caller: caller, start: start, span: span}
		var reqCtx context.Context
		reqCtx, x.cancel = context.WithCancelCause(g.base)
		x.ctx, x.stopDL = context.WithDeadlineCause(reqCtx, deadline,
			schemas.Timeout("the request did not finish within %s", g.cfg.RequestTimeout))

		st, err := g.cl.Start(&client.Request{
			ID:       id,
			Kind:     kind,
			Model:    req.Model,
			Body:     payload(req),
			Deadline: deadline,
			Priority: req.Priority,
			Tenant:   caller.Tenant,
			Trace:    outgoingTrace(span, c.Get("traceparent")),
		})
		if err != nil {
			x.stopDL()
			x.cancel(nil)
			return err
		}
		g.inflight.add()
		x.st = st
		x.w = startWatcher(c.Context().Conn(), g.cfg.ProbeInterval, g.cfg.StuckTimeout, st.Buffered, x.cancel)

		if !req.Stream {
			finished := false
			defer func() { x.end(finished) }()
			var out []byte
			out, err = x.unary()
			if err != nil {
				return err
			}
			finished = true
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(fiber.StatusOK).Send(out)
		}

		// Commit to a 200 stream only once the first chunk is there, so that
		// errors before any token keep their real status.
		first, err := st.Next(x.ctx)
		if err != nil {
			e := x.fail(err) // before end, which cancels the context
			x.end(false)
			return e
		}
		firstAt := time.Now()
		x.w.touch(firstAt)
		if span.IsRecording() && first.Type == schemas.FrameChunk {
			span.AddEvent(tracing.EventFirstToken, trace.WithTimestamp(firstAt))
		}

		c.Locals(localStreaming, true)
		c.Status(fiber.StatusOK)
		g.m.activeStreams.Inc()
		// The stream is written straight to the connection, not through
		// fasthttp's body-stream writer: that one hands every flush to a
		// second goroutine over a pipe and writes at most 4 KiB per syscall,
		// which made the SSE writes most of the gateway's CPU. After a clean
		// end the connection goes back to fasthttp for the next request.
		keepAlive := g.keepAlive(c)
		raw := c.Context().Conn()
		w := newStreamWriter(raw, keepAlive)
		w.WriteHead(streamHead(c, keepAlive))
		sent, pre := 0, false
		if first.Type == schemas.FrameChunk && c.Context().ConnRequestNum() == 1 {
			// The first token goes out from this goroutine: the hijack
			// handler runs on a new one, and on a busy machine waiting for
			// it to be scheduled showed in the time to first token. Only on
			// a connection's first request: after others, fasthttp may still
			// hold a pipelined response in its buffer, which must go first
			// (it flushes it when the handler returns).
			sent, _ = writeChunkFrame(w, first.Payload)
			pre = true
			if !st.Buffered() {
				_ = w.Flush()
			}
		}
		c.Context().HijackSetNoResponse(true)
		c.Context().Hijack(func(hc net.Conn) {
			reuse := x.writeStream(w, first, firstAt, sent, pre)
			w.release()
			if reuse && keepAlive && !g.draining.Load() {
				g.resume(hc, raw)
				return
			}
			_ = raw.Close() // Server.KeepHijackedConns: fasthttp leaves it to us
		})
		return nil
	}
}

// streamHead is the HTTP/1.1 response head of an SSE stream, with every
// header set on the response so far (request id, rate limits...).
func streamHead(c *fiber.Ctx, chunked bool) []byte {
	b := make([]byte, 0, 512)
	b = append(b, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"...)
	if chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	} else {
		b = append(b, "Connection: close\r\n"...)
	}
	c.Response().Header.VisitAll(func(k, v []byte) {
		switch strings.ToLower(string(k)) {
		case "content-type", "content-length", "transfer-encoding", "connection", "cache-control", "x-accel-buffering":
			return
		}
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, "\r\n"...)
	})
	return append(b, "\r\n"...)
}

// unary waits for the done frame of a stream:false request and returns its
// payload, the whole OpenAI response object.
func (x *exchange) unary() ([]byte, error) {
	for {
		f, err := x.st.Next(x.ctx)
		if err != nil {
			return nil, x.fail(err)
		}
		x.w.touch(time.Now())
		if f.Type == schemas.FrameDone {
			x.usage(f.Payload)
			return f.Payload, nil
		}
		// A chunk has no place in a stream:false reply; the done frame has it all.
	}
}

// writeStream is the SSE body writer. It runs in its own goroutine after the
// handler returned: it uses only x, recovers its panics (nothing else would),
// and ends when the stream is done, fails, the client goes or the gateway
// cuts it on shutdown. When pre is set the handler already wrote f, a chunk
// of sent events (counted here). reuse reports that the body ended cleanly
// and the connection may serve another request.
func (x *exchange) writeStream(w *streamWriter, f schemas.Frame, firstAt time.Time, sent int, pre bool) (reuse bool) {
	g := x.g
	finished, outcome := false, "done"
	bodyEnded := false // [DONE] written
	var streamErr error
	// A cut (shutdown, deadline) must not wait long on a client that reads
	// nothing: a second to take the final error event.
	stopCut := context.AfterFunc(x.ctx, func() { _ = w.conn.SetWriteDeadline(time.Now().Add(time.Second)) })
	defer func() {
		if r := recover(); r != nil {
			outcome = "panic"
			streamErr = fmt.Errorf("stream writer panic: %v", r)
			g.log.Error("stream writer panic", "request_id", x.id, "trace_id", tracing.TraceID(x.span), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
		g.m.activeStreams.Dec()
		d := time.Since(x.start)
		g.m.duration.WithLabelValues(x.route, x.label).Observe(d.Seconds())
		g.logRequest(x.id, x.route, x.model, fiber.StatusOK, d, fiber.MethodPost, outcome, tracing.TraceID(x.span))
		if streamErr != nil {
			tracing.Fail(x.span, streamErr)
		}
		endSpan(x.span, fiber.StatusOK, nil, outcome) // after the last frame
		notCut := stopCut()                           // before end cancels ctx; a cut connection has a write deadline set
		reuse = notCut && bodyEnded && w.err == nil
		x.end(finished)
	}()

	if f.Type == schemas.FrameChunk {
		g.m.ttft.WithLabelValues(x.label).Observe(firstAt.Sub(x.start).Seconds())
	}
	itl := g.m.itl.WithLabelValues(x.label)
	last := firstAt
	written := pre
	for {
		switch f.Type {
		case schemas.FrameChunk:
			var err error
			if written {
				written, err = false, w.err
				g.m.chunks.Add(float64(sent))
			} else {
				var n int
				n, err = writeChunkFrame(w, f.Payload)
				g.m.chunks.Add(float64(n))
				if err == nil && !x.st.Buffered() {
					err = w.Flush() // once per burst
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
			bodyEnded = writeDone(w) == nil
			return
		}

		var err error
		f, err = x.st.Next(x.ctx)
		now := time.Now()
		x.w.touch(now)
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
			bodyEnded = writeErrorEvent(w, e) == nil
			return
		}
		if f.Type == schemas.FrameChunk {
			itl.Observe(now.Sub(last).Seconds())
			last = now
		}
	}
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
	x.w.stop()
	if !finished && (x.writeFailed || x.w.gone.Load()) {
		x.g.m.disconnects.Inc()
	}
	x.st.Close()
	x.stopDL()
	x.cancel(nil)
	x.g.inflight.done()
}

// usage hands the done payload's usage to OnUsage. A panicking hook is
// logged; it must not break the response.
func (x *exchange) usage(done []byte) {
	if x.g.cfg.OnUsage == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			x.g.log.Error("OnUsage panicked", "request_id", x.id, "trace_id", tracing.TraceID(x.span), "panic", fmt.Sprint(r))
		}
	}()
	var u schemas.Usage
	if p := schemas.UsageOf(done); p != nil {
		u = *p
	}
	x.g.cfg.OnUsage(x.caller, x.model, u)
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
