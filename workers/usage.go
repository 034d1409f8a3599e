package workers

import (
	"encoding/json"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// UsageSink takes the usage record of each finished NATS-native request that
// a dispatcher admitted for an API key (header schemas.HdrKeyID). Requests
// without that header (a gateway's) are not recorded here: their gateway
// records them, and a record from both would count them twice. Record is
// called on the request's goroutine after its last frame: it must not block
// for long.
type UsageSink interface {
	Record(rec schemas.UsageRecord)
}

// NATSUsageSink publishes each record as JSON on schemas.UsagePrefix +
// Source with core NATS: at most once. A durable publisher (JetStream) can
// take its place through Config.Usage.
type NATSUsageSink struct {
	NC     *nats.Conn
	Source string // the worker id
	Log    *slog.Logger
}

// Record implements UsageSink.
func (s NATSUsageSink) Record(rec schemas.UsageRecord) {
	b, _ := json.Marshal(rec)
	if err := s.NC.Publish(schemas.UsagePrefix+s.Source, b); err != nil && s.Log != nil {
		s.Log.Warn("publishing a usage record failed", "request_id", rec.RequestID, "key_id", rec.KeyID, "err", err)
	}
}

// usageMark is what a dispatcher's admission wrote on a tenant request.
type usageMark struct {
	keyID, tenant string
	reserved      int
	window        int64
}

// readUsageMark reads the admission headers; keyID "" means the request is
// not the worker's to record.
func readUsageMark(h nats.Header) usageMark {
	u := usageMark{keyID: h.Get(schemas.HdrKeyID)}
	if u.keyID == "" {
		return u
	}
	u.tenant = h.Get(schemas.HdrTenant)
	if v := h.Get(schemas.HdrReserved); v != "" {
		u.reserved, _ = strconv.Atoi(v)
		u.window, _ = strconv.ParseInt(h.Get(schemas.HdrWindow), 10, 64)
	}
	return u
}

// recordUsage hands a finished request's usage to the sink, if it is ours to record.
func (c *call) recordUsage(res *engine.Result) {
	if c.usage.keyID == "" || c.w.usage == nil {
		return
	}
	c.w.usage.Record(schemas.UsageRecord{
		RequestID: c.req.ID, KeyID: c.usage.keyID, Tenant: c.usage.tenant, Model: c.req.Model,
		Usage: res.Usage, Estimated: res.UsageEstimated, Reserved: c.usage.reserved, Window: c.usage.window,
	})
}
