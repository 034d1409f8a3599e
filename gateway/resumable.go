package gateway

import (
	"bufio"
	"context"
	"strconv"
	"strings"

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

// startResumable queues a resumable chat stream and follows it.
func (g *Gateway) startResumable(c *fiber.Ctx, req *schemas.Request, caller Principal) error {
	ctx, cancel := g.storeCtx(c)
	defer cancel()
	id, err := g.cfg.Responses.SubmitChat(ctx, caller.Tenant, caller.KeyID, caller.Reserved, caller.Window, strings.Clone(req.Model), payload(req))
	if err != nil {
		return err
	}
	return g.followChat(c, id, 0)
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
	if err := g.cfg.Responses.ChatStream(ctx, p.Tenant, id); err != nil {
		return err
	}
	return g.followChat(c, id, after)
}

func (g *Gateway) followChat(c *fiber.Ctx, id string, after int) error {
	g.inflight.add()
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set(HeaderStreamID, id)
	c.Status(fiber.StatusOK)
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer g.inflight.done()
		ctx, cancel := context.WithTimeout(g.base, g.cfg.RequestTimeout)
		defer cancel()
		err := g.cfg.Responses.FollowChat(ctx, id, after, func(n int, line []byte) error {
			_, _ = w.WriteString("id: ")
			_, _ = w.WriteString(id)
			_ = w.WriteByte(':')
			_, _ = w.WriteString(strconv.Itoa(n))
			_, _ = w.WriteString("\ndata: ")
			_, _ = w.Write(line)
			_, _ = w.WriteString("\n\n")
			return w.Flush()
		})
		if err != nil {
			g.log.Debug("resumable chat: follow ended", "id", id, "err", err)
		}
	})
	return nil
}
