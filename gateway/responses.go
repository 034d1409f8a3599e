package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/responses"
	"github.com/tokenbus/tokenbus/schemas"
)

// The Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id},
// GET .../input_items, POST .../cancel), translated to one chat request on
// the bus (the responses package). Stored responses and background mode
// need Config.Responses (JetStream); without it store is ignored and
// background refused.

func (g *Gateway) responsesRoutes(app *fiber.App) {
	app.Post("/v1/responses", g.createResponse)
	app.Get("/v1/responses/:id", g.getResponse)
	app.Delete("/v1/responses/:id", g.deleteResponse)
	app.Get("/v1/responses/:id/input_items", g.responseInputItems)
	app.Post("/v1/responses/:id/cancel", g.cancelResponse)
	app.Post("/v1/chat/completions/:id/cancel", g.cancelChatStream) // resumable chat streams (resumable.go)
}

func (g *Gateway) createResponse(c *fiber.Ctx) error {
	start := time.Now()
	id, _ := c.Locals(localID).(string)
	span := startSpan(c, schemas.KindChat, id, start) // observe or the stream writer ends it
	if !isJSON(c.Get(fiber.HeaderContentType)) {
		return errUnsupportedMediaType
	}
	if ce := c.Get(fiber.HeaderContentEncoding); ce != "" && !strings.EqualFold(ce, "identity") {
		return errContentEncoding // as completions: an inflated body would have no bound
	}
	req, err := responses.Parse(c.Request().Body())
	if err != nil {
		return err
	}
	if err := schemas.CheckMetadata(req.Metadata); err != nil {
		return err
	}
	store := g.cfg.Responses
	if req.Background && !req.Stored() {
		return schemas.ErrResponseInput.At("background", "background", "background mode needs store: true")
	}
	if req.Background && store == nil {
		return schemas.ErrResponsesOff.New("no JetStream")
	}
	input, err := responses.Items(req.Input)
	if err != nil {
		return err
	}
	// The stored responses this request reads: its previous one, then
	// those its item references name (each read once).
	recs := map[string]*responses.Record{}
	var history []responses.Item
	if req.PreviousResponseID != nil && *req.PreviousResponseID != "" {
		if store == nil {
			return schemas.ErrResponseNotFound.At("previous_response_id", *req.PreviousResponseID)
		}
		p, err := g.caller(c)
		if err != nil {
			return err
		}
		ctx, cancel := g.storeCtx(c)
		prev, _, err := store.Get(ctx, p.Tenant, *req.PreviousResponseID)
		cancel()
		if err != nil {
			if schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
				return schemas.ErrResponseNotFound.At("previous_response_id", *req.PreviousResponseID)
			}
			return err
		}
		history = prev.Conversation()
		recs[*req.PreviousResponseID] = prev
	}
	if err := g.resolveItemRefs(c, input, recs); err != nil {
		return err
	}
	body, err := responses.ChatBody(req, history, input)
	if err != nil {
		return err
	}
	// The chat request is what is authorised and rate-limited, as if the
	// client had sent it.
	view, perr := schemas.ReadRequestFor(schemas.KindChat, body, "")
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
	var caller Principal
	if g.cfg.Authorize != nil {
		p, err := g.cfg.Authorize(c, view)
		if err != nil {
			return err
		}
		caller = Principal{Tenant: strings.Clone(p.Tenant), KeyID: strings.Clone(p.KeyID), Reserved: p.Reserved, Window: p.Window,
			Band: p.Band, Weight: p.Weight, MaxQueue: p.MaxQueue}
	}
	if !known {
		return schemas.ErrModelNotFound.New(req.Model)
	}
	// The context window: refused, or the oldest items dropped (truncation
	// auto), once the caller is known (a count is a request to a worker).
	deadline := start.Add(g.cfg.RequestTimeout)
	if limit := g.maxModelLen(req.Model); limit > 0 {
		conv := append(history[:len(history):len(history)], input...)
		fctx, cancel := context.WithDeadline(g.base, deadline)
		fit, err := responses.Fit(fctx, req, conv, limit, g.tokenCounter(id, req.Model, caller))
		cancel()
		if err != nil {
			return err
		}
		if len(fit) != len(conv) {
			if body, err = responses.ChatBody(req, nil, fit); err != nil {
				return err
			}
		}
	}
	resp := responses.New("resp_"+nuid.Next(), req, start)
	resp.Store = req.Stored() && store != nil
	rec := &responses.Record{Response: *resp, Tenant: caller.Tenant, KeyID: caller.KeyID, Input: input, History: history,
		Reserved: caller.Reserved, Window: caller.Window}

	if req.Background {
		rec.Body = body
		ctx, cancel := g.storeCtx(c)
		defer cancel()
		// A streamed one's follow first: nothing is queued for a client
		// that would get no events.
		var f *responses.Follow
		if req.Stream {
			if f, err = store.OpenFollow(ctx, caller.Tenant, rec.Response.ID); err != nil {
				return err
			}
		}
		if err := store.Submit(ctx, rec); err != nil {
			if f != nil {
				f.Close(ctx)
			}
			return err
		}
		if req.Stream {
			return g.followResponse(c, f, rec.Response.ID, -1)
		}
		return c.JSON(&rec.Response)
	}

	// A response to be stored is counted against its tenant's quota before
	// it is generated (a 429 before any token), and its end is stored
	// before it is answered (respExchange.keep): one that cannot be stored
	// is an error to the client, not a 200 that is gone afterwards.
	if resp.Store {
		ctx, cancel := g.storeCtx(c)
		err := store.Reserve(ctx, rec)
		cancel()
		if err != nil {
			return err
		}
	}
	x := &respExchange{g: g, id: id, route: c.Route().Path, model: req.Model, label: label, caller: caller, start: start,
		span: span, rec: rec}

	creq := &client.Request{ID: id, Kind: schemas.KindChat, Model: req.Model, Body: body, Deadline: deadline,
		Priority: view.Priority, MaxTokens: view.MaxTokens, Trace: outgoingTrace(span, c.Get("traceparent"))}
	user := req.User
	if user == "" && req.SafetyIdentifier != nil {
		user = *req.SafetyIdentifier // the end user, as user is
	}
	g.flow(creq, caller, user)
	if req.ServiceTier != nil && *req.ServiceTier == "flex" {
		creq.Band = schemas.BandBatch // a request may lower its band, never raise it
	}
	var reqCtx context.Context
	reqCtx, x.cancel = context.WithCancelCause(g.base)
	x.ctx, x.stopDL = context.WithDeadlineCause(reqCtx, deadline, g.errTimeout)
	st, err := g.cl.Start(creq)
	if err != nil {
		x.stopDL()
		x.cancel(nil)
		x.release()
		return err
	}
	g.inflight.add()
	x.st = st
	x.w = g.streams.Watch(c.Context(), st.Buffered, x.cancel, errClientGone)
	// The first frame before anything is answered: errors before any
	// token keep their HTTP status.
	var first schemas.Frame
	if req.Stream {
		// A stream held for capacity (a cold start, docs/capacity.md)
		// begins after HoldKeepalive with its first events and SSE
		// comments until its first token.
		first, err = g.firstFrame(x.ctx, st)
	} else {
		first, err = st.Next(x.ctx)
	}
	if err == errHeld {
		return x.stream(c, resp, schemas.Frame{}, true)
	}
	if err != nil {
		e := x.fail(err)
		x.end(false)
		return e
	}
	if !req.Stream {
		return x.unary(c, resp, first)
	}
	return x.stream(c, resp, first, false)
}

// writeSSE writes one event as OpenAI does ("event: <type>" then
// "data:"), flushed: a write error (the client gone) ends the follow.
func writeSSE(w *bufio.Writer, typ string, data []byte) error {
	_, _ = w.WriteString("event: ")
	_, _ = w.WriteString(typ)
	_, _ = w.WriteString("\ndata: ")
	_, _ = w.Write(data)
	_, _ = w.WriteString("\n\n")
	return w.Flush()
}

// responseUsage hands a foreground response's usage to OnUsage.
func (g *Gateway) responseUsage(id string, p Principal, model string, r *responses.Response) {
	if g.cfg.OnUsage == nil || r.Usage == nil {
		return
	}
	g.cfg.OnUsage(schemas.UsageRecord{RequestID: id, KeyID: p.KeyID, Tenant: p.Tenant, Model: model,
		Usage:    schemas.Usage{PromptTokens: r.Usage.InputTokens, CompletionTokens: r.Usage.OutputTokens, TotalTokens: r.Usage.TotalTokens},
		Reserved: p.Reserved, Window: p.Window})
}

// followResponse streams a background response's events after
// sequence_number after, from the store: stored ones, then live ones,
// written by whichever runner runs it. f is the follow, opened before.
func (g *Gateway) followResponse(c *fiber.Ctx, f *responses.Follow, id string, after int) error {
	g.inflight.add()
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Status(fiber.StatusOK)
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer g.inflight.done()
		defer f.Close(g.base)
		ctx, cancel := context.WithTimeout(g.base, g.cfg.RequestTimeout)
		defer cancel()
		err := f.Events(ctx, after, func(ev *responses.Event, raw []byte) error {
			return writeSSE(w, ev.Type, raw)
		})
		if err != nil {
			g.log.Debug("responses: follow ended", "id", id, "err", err)
		}
	})
	return nil
}

func (g *Gateway) storedResponse(c *fiber.Ctx) (*responses.Record, Principal, error) {
	if g.cfg.Responses == nil {
		return nil, Principal{}, schemas.ErrResponseNotFound.New(pathParam(c, "id"))
	}
	p, err := g.caller(c)
	if err != nil {
		return nil, p, err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	rec, _, err := g.cfg.Responses.Get(ctx, p.Tenant, pathParam(c, "id"))
	return rec, p, err
}

func (g *Gateway) getResponse(c *fiber.Ctx) error {
	rec, p, err := g.storedResponse(c)
	if err != nil {
		return err
	}
	if c.Query("stream") != "true" {
		return c.JSON(&rec.Response)
	}
	if !rec.Response.Background {
		return schemas.ErrResponseState.New("Only background responses can be streamed with GET.")
	}
	after := -1
	if v := c.Query("starting_after"); v != "" {
		n, err := parseInt(v)
		if err != nil {
			return schemas.ErrInvalidType.At("starting_after", "starting_after", "an integer", "'"+v+"'")
		}
		after = n
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	f, err := g.cfg.Responses.OpenFollow(ctx, p.Tenant, rec.Response.ID)
	if err != nil {
		return err
	}
	return g.followResponse(c, f, rec.Response.ID, after)
}

func (g *Gateway) deleteResponse(c *fiber.Ctx) error {
	if g.cfg.Responses == nil {
		return schemas.ErrResponseNotFound.New(pathParam(c, "id"))
	}
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	id := pathParam(c, "id")
	if err := g.cfg.Responses.Delete(ctx, p.Tenant, id); err != nil {
		return err
	}
	return c.JSON(responses.Deleted{ID: id, Object: "response.deleted", Deleted: true})
}

func (g *Gateway) responseInputItems(c *fiber.Ctx) error {
	rec, _, err := g.storedResponse(c)
	if err != nil {
		return err
	}
	// OpenAI lists them newest first by default (order=desc).
	items := make([]responses.Item, 0, len(rec.Input))
	if c.Query("order") == "asc" {
		items = append(items, rec.Input...)
	} else {
		for i := len(rec.Input) - 1; i >= 0; i-- {
			items = append(items, rec.Input[i])
		}
	}
	// Paging as OpenAI's: after an item id, limit 1..100 (default 20).
	if after := c.Query("after"); after != "" {
		for i, it := range items {
			if it.ID == after {
				items = items[i+1:]
				break
			}
		}
	}
	limit := 20
	if v := c.Query("limit"); v != "" {
		n, err := parseInt(v)
		if err != nil || n < 1 || n > 100 {
			return schemas.ErrInvalidValue.At("limit", "limit", "expected an integer from 1 to 100")
		}
		limit = n
	}
	l := responses.ItemList{Object: "list", Data: items}
	if len(items) > limit {
		l.Data, l.HasMore = items[:limit], true
	}
	items = l.Data
	if len(items) > 0 {
		l.FirstID, l.LastID = items[0].ID, items[len(items)-1].ID
	}
	return c.JSON(l)
}

func (g *Gateway) cancelResponse(c *fiber.Ctx) error {
	if g.cfg.Responses == nil {
		return schemas.ErrResponseNotFound.New(pathParam(c, "id"))
	}
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	r, err := g.cfg.Responses.Cancel(ctx, p.Tenant, pathParam(c, "id"))
	if err != nil {
		return err
	}
	return c.JSON(r)
}

func parseInt(s string) (int, error) {
	var n int
	err := json.Unmarshal([]byte(s), &n)
	return n, err
}
