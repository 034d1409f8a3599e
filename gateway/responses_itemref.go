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
// tenant's, store:false, an id made elsewhere) is OpenAI's 404. recs holds
// the stored responses read already (the request's previous response),
// by id; those read here are added.
func (g *Gateway) resolveItemRefs(c *fiber.Ctx, input []responses.Item, recs map[string]*responses.Record) error {
	var tenant *string // the caller's, looked up at the first read
	read := 0
	byID := map[string]map[string]responses.Item{} // each record's output items, indexed once
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
		if rec == nil && read >= maxRefResponses {
			return schemas.ErrResponseInput.At(param, param,
				fmt.Sprintf("item references name more than %d stored responses", maxRefResponses))
		}
		if rec == nil {
			if tenant == nil {
				p, err := g.caller(c)
				if err != nil {
					return err
				}
				tenant = &p.Tenant
			}
			read++
			ctx, cancel := g.storeCtx(c)
			r, _, err := store.Get(ctx, *tenant, respID)
			cancel()
			if err != nil {
				if schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
					return schemas.ErrItemNotFound.At(param, id)
				}
				return err
			}
			rec, recs[respID] = r, r
		}
		items := byID[respID]
		if items == nil {
			items = rec.ItemsByID()
			byID[respID] = items
		}
		it, found := items[id]
		if !found {
			return schemas.ErrItemNotFound.At(param, id)
		}
		input[i] = it
	}
	return nil
}
