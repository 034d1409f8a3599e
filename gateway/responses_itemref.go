package gateway

import (
	"fmt"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/responses"
	"github.com/tokenbus/tokenbus/schemas"
)

// maxRefResponses bounds the stored responses one request's item
// references may name: each is a read of the store, and a body full of
// references to distinct responses must not turn into thousands of them.
const maxRefResponses = 64

// resolveItemRefs puts in place of each item_reference of input the item it
// names, from the tenant's stored response whose id the item id carries
// (responses/itemref.go). An item that cannot be found (no store, another
// tenant's, store:false, an id made elsewhere) is OpenAI's 404.
func (g *Gateway) resolveItemRefs(c *fiber.Ctx, input []responses.Item) error {
	var recs map[string]*responses.Record
	for i := range input {
		if input[i].Type != "item_reference" {
			continue
		}
		id := input[i].ID
		param := fmt.Sprintf("input[%d].id", i)
		respID, ok := responses.ResponseOfItem(id)
		store := g.cfg.Responses
		if !ok || store == nil {
			return schemas.ErrItemNotFound.At(param, id)
		}
		rec := recs[respID]
		if rec == nil && len(recs) >= maxRefResponses {
			return schemas.ErrResponseInput.At(param, param,
				fmt.Sprintf("item references name more than %d stored responses", maxRefResponses))
		}
		if rec == nil {
			p, err := g.caller(c)
			if err != nil {
				return err
			}
			ctx, cancel := g.storeCtx(c)
			r, _, err := store.Get(ctx, p.Tenant, respID)
			cancel()
			if err != nil {
				if schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
					return schemas.ErrItemNotFound.At(param, id)
				}
				return err
			}
			if recs == nil {
				recs = map[string]*responses.Record{}
			}
			rec, recs[respID] = r, r
		}
		it, found := rec.Find(id)
		if !found {
			return schemas.ErrItemNotFound.At(param, id)
		}
		input[i] = it
	}
	return nil
}
