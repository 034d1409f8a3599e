package gateway

import (
	"bufio"
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/responses"
	"github.com/tokenbus/tokenbus/schemas"
)

// Resumable chat streams: a streaming /v1/chat/completions request with
// HeaderResumable "true" runs detached from its connection, by a runner of
// the responses package, its chunks kept in JetStream. Each SSE event has
// an id line, "<stream-id>:<n>"; the same request sent again (to any
// gateway) with Last-Event-ID continues after event n. Off without
// Config.Responses (the header is then ignored).

// HeaderResumable opts a chat stream in; HeaderStreamID names it in the
// response.
const (
	HeaderResumable = "Tokenbus-Resumable"
	HeaderStreamID  = "Tokenbus-Stream-Id"
)

// resumable reports whether a chat request asks to resume a stream, and
// which (id, after); ok false: not a resume.
func resumeOf(c *fiber.Ctx) (id string, after int, ok bool) {
	v := c.Get(fiber.HeaderLastEventID)
	if !strings.HasPrefix(v, responses.ChatStreamPrefix) {
		return "", 0, false
	}
	id, n, found := strings.Cut(v, ":")
	after, err := strconv.Atoi(n)
	if !found || err != nil || after < 0 {
		return "", 0, false
	}
	return strings.Clone(id), after, true
}

// startResumable queues a resumable chat stream and follows it. The follow
// (its consumer, its tenant's slot) is had first: a stream is queued only
// for a client that will get its events, and every refusal is a status.
func (g *Gateway) startResumable(c *fiber.Ctx, req *schemas.Request, caller Principal) error {
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	store := g.cfg.Responses
	id := responses.NewChatID()
	f, err := store.OpenFollow(ctx, caller.Tenant, id)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(g.cfg.RequestTimeout)
	if err := store.SubmitChat(ctx, id, caller.Tenant, caller.KeyID, caller.Reserved, caller.Window, strings.Clone(req.Model), payload(req), deadline); err != nil {
		f.Close(ctx)
		return err
	}
	return g.followChat(c, f, id, 0, deadline)
}

// resumeChat follows a resumable chat stream of the caller's tenant after
// event after.
func (g *Gateway) resumeChat(c *fiber.Ctx, id string, after int) error {
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	store := g.cfg.Responses
	rec, _, err := store.ChatStream(ctx, p.Tenant, id)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(g.cfg.RequestTimeout)
	if rec.Deadline > 0 {
		deadline = time.UnixMilli(rec.Deadline)
	}
	f, err := store.OpenFollow(ctx, p.Tenant, id)
	if err != nil {
		return err
	}
	return g.followChat(c, f, id, after, deadline)
}

// followGrace: a follower waits this long past its stream's deadline for
// the runner's timeout line (a stream still queued at its deadline gets
// it when a runner takes it) before it writes one itself.
const followGrace = 30 * time.Second

func (g *Gateway) followChat(c *fiber.Ctx, f *responses.Follow, id string, after int, deadline time.Time) error {
	g.inflight.add()
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set(HeaderStreamID, id)
	c.Status(fiber.StatusOK)
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer g.inflight.done()
		defer f.Close(g.base)
		ctx, cancel := context.WithDeadlineCause(g.base, deadline.Add(followGrace), g.errTimeout)
		defer cancel()
		err := f.Chat(ctx, after, func(n int, line []byte) error {
			_, _ = w.WriteString("id: ")
			_, _ = w.WriteString(id)
			_ = w.WriteByte(':')
			_, _ = w.WriteString(strconv.Itoa(n))
			_, _ = w.WriteString("\ndata: ")
			_, _ = w.Write(line)
			_, _ = w.WriteString("\n\n")
			return w.Flush()
		})
		if err != nil && errors.Is(err, g.errTimeout) {
			// No runner wrote the end in time: the client still gets one.
			_, _ = w.WriteString("data: ")
			_, _ = w.Write(g.errTimeout.JSON())
			_, _ = w.WriteString("\n\n")
			_ = w.Flush()
		}
		if err != nil {
			g.log.Debug("resumable chat: follow ended", "id", id, "err", err)
		}
	})
	return nil
}

// cancelChatStream is POST /v1/chat/completions/{id}/cancel: it ends a
// resumable chat stream of the caller's tenant (its last event a
// stream_cancelled error) and answers its state.
func (g *Gateway) cancelChatStream(c *fiber.Ctx) error {
	id := pathParam(c, "id")
	if g.cfg.Responses == nil || !strings.HasPrefix(id, responses.ChatStreamPrefix) {
		return schemas.ErrResponseNotFound.New(id)
	}
	p, err := g.caller(c)
	if err != nil {
		return err
	}
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	st, err := g.cfg.Responses.CancelChat(ctx, p.Tenant, id)
	if err != nil {
		return err
	}
	return c.JSON(st)
}
