package gateway

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/responses"
	"github.com/tokenbus/tokenbus/schemas"
)

// A Responses request's conversation must fit its model's context
// (responses.Fit): the gateway knows max_model_len from the catalog (what
// /v1/models lists: the registry's, or the workers' heartbeats) and counts
// tokens, when the estimate comes near it, with a tokenize request on the
// bus, which a worker answers with the engine's own tokenizer.

// contextLengths is the catalog's MaxModelLen, where it has one (the real
// catalog does; a Catalog without it checks nothing).
type contextLengths interface {
	MaxModelLen(model string) int
}

func (g *Gateway) maxModelLen(model string) int {
	if cl, ok := g.cat.(contextLengths); ok {
		return cl.MaxModelLen(model)
	}
	return 0
}

// countTimeout bounds one count: a worker answers a tokenize at once.
const countTimeout = 10 * time.Second

// tokenCounter counts a tokenize body's tokens on the bus, as the caller
// (its tenant's flow) and as part of request id (ids id.count1...).
func (g *Gateway) tokenCounter(id, model string, caller Principal) responses.Counter {
	n := 0
	return func(ctx context.Context, body []byte) (int, error) {
		n++
		deadline := time.Now().Add(countTimeout)
		cid := id + ".count" + strconv.Itoa(n)
		if !schemas.ValidRequestID(cid) { // a client's id at the length limit
			cid = "count." + nuid.Next()
		}
		creq := &client.Request{ID: cid, Kind: schemas.KindTokenize, Model: model, Body: body, Deadline: deadline}
		g.flow(creq, caller, "")
		st, err := g.cl.Start(creq)
		if err != nil {
			return 0, err
		}
		defer st.Close()
		cctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		for {
			f, err := st.Next(cctx)
			if err != nil {
				return 0, err
			}
			if f.Type != schemas.FrameDone {
				continue
			}
			var out struct {
				Count *int `json:"count"`
			}
			if err := json.Unmarshal(f.Payload, &out); err != nil || out.Count == nil {
				return 0, schemas.ErrInternal.New("a tokenize answer without count")
			}
			return *out.Count, nil
		}
	}
}
