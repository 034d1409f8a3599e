package gateway

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

// Keys of fiber.Ctx locals the handlers leave for observe.
const (
	localID        = "tb.id"        // string: the request id
	localModel     = "tb.model"     // string: the model the request named
	localLabel     = "tb.label"     // string: the model as a metric label
	localStreaming = "tb.streaming" // bool: the stream writer records duration and logs
	localPreflight = "tb.preflight" // bool: a CORS preflight, answered by the cors middleware
)

const routePreflight = "preflight"

const routeUnmatched = "unmatched"

// observe runs first for every request: it settles the request id, turns a
// handler's error into its response, then counts and logs the request.
func (g *Gateway) observe(c *fiber.Ctx) error {
	start := time.Now()
	id := g.requestID(c.Get(fiber.HeaderXRequestID))
	c.Locals(localID, id)
	c.Set(fiber.HeaderXRequestID, id)

	err := c.Next()
	outcome := "done"
	if err != nil {
		// As errorHandler does for a request observe saw.
		e := APIError(c, err, g.cfg.BodyLimit)
		if werr := g.writeError(c, e); werr != nil {
			return werr
		}
		outcome = outcomeOf(e)
	}

	route := c.Route().Path
	if route == "/" { // only middleware matched
		route = routeUnmatched
		if pre, _ := c.Locals(localPreflight).(bool); pre {
			route = routePreflight
		}
	}
	label, _ := c.Locals(localLabel).(string)
	status := c.Response().StatusCode()
	g.m.requests.WithLabelValues(route, label, strconv.Itoa(status)).Inc()
	if streaming, _ := c.Locals(localStreaming).(bool); streaming {
		return nil
	}
	d := time.Since(start)
	g.m.duration.WithLabelValues(route, label).Observe(d.Seconds())
	model, _ := c.Locals(localModel).(string)
	span, _ := c.Locals(localSpan).(trace.Span)
	if span == nil {
		span = noop.Span{}
	}
	g.logRequest(id, route, model, status, d, LogMethod(c.Method()), outcome, tracing.TraceID(span))
	endSpan(span, status, err, outcome)
	return nil
}

// outcomeOf is how a request that failed with e ended, for its log line and
// span (tokenbus.outcome): client_gone when the client hung up (499), else
// e's code.
func outcomeOf(e *schemas.Error) string {
	switch {
	case e.Status == errClientGone.Status:
		return "client_gone"
	case e.Body.Code != nil && *e.Body.Code != "":
		return *e.Body.Code
	}
	return "error"
}

// logRequest logs one finished request: health checks and scrapes at Debug,
// other server errors at Warn, the rest at Info; traceID is "" with tracing
// off.
func (g *Gateway) logRequest(id, route, model string, status int, d time.Duration, method, outcome, traceID string) {
	level := slog.LevelInfo
	switch {
	case route == "/health" || route == "/ready" || route == "/metrics":
		level = slog.LevelDebug // polled: a 503 from /ready is an answer, not an incident
	case status >= 500:
		level = slog.LevelWarn
	}
	if !g.log.Enabled(context.Background(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", id), slog.String("method", method), slog.String("route", route),
		slog.String("model", schemas.Clip(g.cfg.Redactor.String(model), schemas.MaxQuoted)), slog.Int("status", status), slog.Duration("duration", d),
	}
	if outcome != "" {
		attrs = append(attrs, slog.String("outcome", outcome))
	}
	if traceID != "" {
		attrs = append(attrs, slog.String("trace_id", traceID))
	}
	g.log.LogAttrs(context.Background(), level, "request", attrs...)
}
