package responses

import (
	"strings"

	"github.com/nats-io/nuid"
)

// Item references. Clients that keep their conversation on the server
// (store: true) may give an earlier response's output back by reference,
// {"type":"item_reference","id":"fc_..."}, instead of the item itself: the
// Vercel AI SDK's Responses provider does, for the assistant's text, its
// tool calls and its reasoning. So that a reference can be resolved without
// an index of every item ever made, the id of an output item names its
// response: <prefix>_<the response id's suffix>_<random>.

// outputItemID is a new id for an output item of response respID.
func outputItemID(prefix, respID string) string {
	suffix, ok := strings.CutPrefix(respID, "resp_")
	if !ok || !validSuffix(suffix) {
		return prefix + "_" + nuid.Next()
	}
	return prefix + "_" + suffix + "_" + nuid.Next()
}

// ResponseOfItem is the id of the response an output item id names; ok is
// false for an id made otherwise (a client's own, an input item's).
func ResponseOfItem(itemID string) (respID string, ok bool) {
	_, rest, found := strings.Cut(itemID, "_")
	if !found {
		return "", false
	}
	suffix, _, found := strings.Cut(rest, "_")
	if !found || !validSuffix(suffix) {
		return "", false
	}
	return "resp_" + suffix, true
}

// validSuffix: what follows "resp_" in a response id this gateway made (a
// nuid: 22 letters and digits).
func validSuffix(s string) bool {
	if len(s) != 22 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// ItemsByID indexes the record's items by id, for item references: its
// output items, and its input items (an output item's id wins).
func (r *Record) ItemsByID() map[string]Item {
	m := make(map[string]Item, len(r.Response.Output)+len(r.Input))
	for _, list := range [][]Item{r.Input, r.Response.Output} {
		for _, it := range list {
			if it.ID != "" {
				m[it.ID] = it
			}
		}
	}
	return m
}
