package gateway

import (
	"strconv"
	"time"
	"unicode"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// Principal is whom Config.Authorize admitted a request as, and what it
// reserved; the gateway puts it in the UsageRecord it hands to
// Config.OnUsage when the request ends.
type Principal struct {
	Tenant string // sent on the bus as Tb-Tenant ("" for none)
	KeyID  string // the API key's id, for usage accounting ("" without keys)
	// Reserved tokens against the key's TPM limit in rate-limit window
	// Window (0: none), settled when the usage is recorded.
	Reserved int
	Window   int64
	// The key's flow control (docs/scheduling.md): its band (0: the
	// default), weight (0: 1) and longest queue wait (0: the dispatcher's).
	Band     schemas.Band
	Weight   int
	MaxQueue time.Duration
}

// flow puts the caller's flow on a bus request: its tenant, band, weight
// and queue limit. Without a tenant (no API keys), and where the operator
// allows it (Config.FlowFromUser), the request's "user" field names the
// flow, so that fairness holds between an application's end users.
func (g *Gateway) flow(r *client.Request, p Principal, user string) {
	r.Tenant, r.Band, r.Weight, r.MaxQueue = p.Tenant, p.Band, p.Weight, p.MaxQueue
	if r.Tenant == "" && g.cfg.FlowFromUser && validFlowUser(user) {
		r.Tenant = "user:" + user
	}
}

// Response headers of a request that waited in a dispatcher's queue: flow
// control's estimates when it was queued (docs/scheduling.md).
const (
	HeaderQueuePosition = "X-Tokenbus-Queue-Position"
	HeaderQueueWait     = "X-Tokenbus-Queue-Wait-Ms"
)

// setQueueHeaders says, on a response, where its request was queued.
func setQueueHeaders(c *fiber.Ctx, st *client.Stream) {
	pos, wait, ok := st.QueueEstimate()
	if !ok {
		return
	}
	c.Set(HeaderQueuePosition, strconv.Itoa(pos))
	if wait > 0 {
		c.Set(HeaderQueueWait, strconv.FormatInt(wait, 10))
	}
}

// validFlowUser: a "user" that can travel as a header value and label a
// flow: 1-64 bytes, no control characters.
func validFlowUser(u string) bool {
	if u == "" || len(u) > 64 {
		return false
	}
	for _, c := range u {
		if unicode.IsControl(c) {
			return false
		}
	}
	return true
}
