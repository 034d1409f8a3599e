package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/gofiber/fiber/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/gateway/httpstream"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/responses"
	"github.com/tokenbus/tokenbus/schemas"
)

// A foreground response (not background) from its chat request's publish
// to its end, answered as one JSON object or streamed as chat streams are:
// on httpstream, its client watched while it is silent (a client that
// leaves cancels the request at its worker), with the stream metrics
// (active streams, time to first token, inter-token latency, events
// written, errors after the first event, duration). Like exchange, the
// stream writer runs after the handler returned and touches no fiber.Ctx.
type respExchange struct {
	g      *Gateway
	id     string
	route  string
	model  string
	label  string
	caller Principal
	start  time.Time
	span   trace.Span
	rec    *responses.Record // its record; stored at the end when Response.Store
	kept   bool

	st     *client.Stream
	ctx    context.Context
	cancel context.CancelCauseFunc
	stopDL context.CancelFunc
	w      *httpstream.Watcher

	writeFailed bool
}

// fail maps an error of Stream.Next: when the request's own context
// ended, its cause says why (client gone, shutdown, deadline).
func (x *respExchange) fail(err error) *schemas.Error {
	var e *schemas.Error
	if errors.As(err, &e) {
		return e
	}
	if x.ctx.Err() != nil {
		return schemas.AsError(context.Cause(x.ctx))
	}
	return schemas.AsError(err)
}

// release uncounts a stored response that was not kept.
func (x *respExchange) release() {
	if x.rec.Response.Store && !x.kept {
		x.g.cfg.Responses.Release(x.g.base, x.rec)
	}
}

// end releases everything; finished says the response ended.
func (x *respExchange) end(finished bool) {
	x.w.Stop()
	if !finished && (x.writeFailed || x.w.Gone()) {
		x.g.m.disconnects.Inc()
	}
	x.st.Close()
	x.stopDL()
	x.cancel(nil)
	x.release()
	x.g.inflight.done()
}

// finished is a response that has ended: its usage counted and handed to
// OnUsage (generated: billed, stored or not), then its record stored.
func (x *respExchange) finished(r *responses.Response) error {
	if u := r.Usage; u != nil {
		if u.InputTokens > 0 {
			x.g.m.tokens.WithLabelValues(x.label, "prompt").Add(float64(u.InputTokens))
		}
		if u.OutputTokens > 0 {
			x.g.m.tokens.WithLabelValues(x.label, "completion").Add(float64(u.OutputTokens))
		}
	}
	x.g.responseUsage(x.id, x.caller, x.model, r)
	if !x.rec.Response.Store {
		return nil
	}
	x.rec.Response = *r
	sctx, cancel := context.WithTimeout(x.g.base, 10*time.Second)
	defer cancel()
	if err := x.g.cfg.Responses.Put(sctx, x.rec); err != nil {
		x.g.log.Warn("responses: could not store a response", "id", r.ID, "err", err)
		return schemas.ErrResponsesOff.New("the response could not be stored")
	}
	x.kept = true
	return nil
}

// unary answers stream:false: the whole response once it has ended.
func (x *respExchange) unary(c *fiber.Ctx, resp *responses.Response, first schemas.Frame) error {
	done := false
	defer func() { x.end(done) }()
	gen := responses.NewGen(resp, func(*responses.Event) error { return nil })
	if err := gen.Begin(); err != nil {
		return err
	}
	if err := gen.Consume(x.ctx, x.st, first); err != nil {
		return x.fail(err)
	}
	done = true
	if err := x.finished(gen.Resp); err != nil {
		return err
	}
	setQueueHeaders(c, x.st)
	return c.JSON(gen.Resp)
}

// stream begins the 200 event stream: response.created, .in_progress and
// the first frame's events from the handler's goroutine, the rest from
// the stream writer's.
func (x *respExchange) stream(c *fiber.Ctx, resp *responses.Response, first schemas.Frame, held bool) error {
	g := x.g
	firstAt := time.Now()
	x.w.Touch(firstAt)
	if x.span.IsRecording() && first.Type == schemas.FrameChunk {
		x.span.AddEvent(tracing.EventFirstToken, trace.WithTimestamp(firstAt))
	}
	c.Locals(localStreaming, true)
	setQueueHeaders(c, x.st)
	c.Status(fiber.StatusOK)
	g.m.activeStreams.Inc()
	s := g.streams.Begin(c.Context(), x.w)
	events := g.m.chunks.WithLabelValues(x.label)
	gen := responses.NewGen(resp, func(ev *responses.Event) error {
		if ev.Terminal() && ev.Response != nil {
			if err := x.finished(ev.Response); err != nil {
				// In place of the end, an error event: the client knows the
				// response is not kept.
				e := schemas.AsError(err)
				x.writeEvent(s, &responses.Event{Type: "error", SequenceNumber: ev.SequenceNumber, Code: e.Body.Code, Message: e.Body.Message})
				return err
			}
		}
		events.Inc()
		return x.writeEvent(s, ev)
	})
	err := gen.Begin()
	done := false
	if err == nil && !held {
		done, err = gen.Feed(first)
	}
	if held { // held for capacity: its first events, then comments until a frame comes
		_ = s.Comment(holdComment)
	}
	if !x.st.Buffered() {
		_ = s.Flush()
	}
	s.Run(x.ctx, func(s *httpstream.Stream) { x.writeStream(s, gen, firstAt, done, err, held) })
	return nil
}

// writeEvent adds ev to the stream (sent at the next flush).
func (x *respExchange) writeEvent(s *httpstream.Stream, ev *responses.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return s.WriteEvent(ev.Type, b)
}

// writeStream is the stream writer (httpstream.Stream.Run): the frames
// after the first turned into events until the response ends, fails or
// the client goes. done and err are what the first frame's Feed said.
func (x *respExchange) writeStream(s *httpstream.Stream, gen *responses.Gen, firstAt time.Time, done bool, err error, held bool) {
	g := x.g
	finished, outcome := false, "done"
	var streamErr error
	defer func() {
		g.streamWriterEnd(recover(), x.id, x.route, x.model, x.label, x.start, x.span, outcome, streamErr)
		x.end(finished)
	}()
	if !held { // held: observed when its first frame comes
		g.m.ttft.WithLabelValues(x.label).Observe(firstAt.Sub(x.start).Seconds())
	}
	itl := g.m.itl.WithLabelValues(x.label)
	last := firstAt
	for !done && err == nil {
		var f schemas.Frame
		var nerr error
		wasHeld := held
		if held {
			f, nerr = g.nextHeld(x.ctx, x.st, s)
			held = false // Next returns content frames only: the first token (or the end) came
			if nerr == nil {
				last = time.Now() // no inter-token latency for the first token
				g.m.ttft.WithLabelValues(x.label).Observe(last.Sub(x.start).Seconds())
			}
		} else {
			f, nerr = x.st.Next(x.ctx)
		}
		now := time.Now()
		x.w.Touch(now)
		if nerr != nil {
			e := x.fail(nerr)
			if e == errClientGone {
				outcome = "client_gone"
				return
			}
			outcome, streamErr = codeLabel(e), e
			// Counted as a 200 (its status went out with the first event):
			// this is where a stream that failed later is seen.
			g.m.streamErrors.WithLabelValues(x.label, codeLabel(e)).Inc()
			err = gen.End(e) // response.failed, in band
			done = true
			break
		}
		if f.Type == schemas.FrameChunk && !wasHeld {
			itl.Observe(now.Sub(last).Seconds())
			last = now
		}
		done, err = gen.Feed(f)
		if err == nil && !done && !x.st.Buffered() {
			err = s.Flush() // once per burst
		}
	}
	if err != nil && s.Err() != nil {
		x.writeFailed, outcome = true, "client_gone"
		return
	}
	if err != nil { // not stored: the error event is written
		outcome, streamErr = "responses_unavailable", err
	}
	finished = true
	_ = s.End()
}
