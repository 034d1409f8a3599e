package responses

import (
	"strings"
	"testing"

	"github.com/nats-io/nuid"
)

// An output item's id names its response, and only ids made so do.
func TestItemIDNamesItsResponse(t *testing.T) {
	resp := "resp_" + nuid.Next()
	a, b := outputItemID("fc", resp), outputItemID("fc", resp)
	if a == b {
		t.Fatalf("two items of one response got one id: %s", a)
	}
	for _, id := range []string{a, outputItemID("msg", resp), outputItemID("rs", resp)} {
		if got, ok := ResponseOfItem(id); !ok || got != resp {
			t.Errorf("%s: response %q %v, want %s", id, got, ok, resp)
		}
	}
	for _, id := range []string{"msg_1", "fc_" + nuid.Next(), "call_abc", "", "fc__x", "fc_" + strings.Repeat("-", 22) + "_x"} {
		if got, ok := ResponseOfItem(id); ok {
			t.Errorf("%q names response %s", id, got)
		}
	}
	rec := &Record{Response: Response{Output: []Item{{ID: a, Type: "function_call"}}}, Input: []Item{{ID: "msg_in", Type: "message"}}}
	items := rec.ItemsByID()
	if it, ok := items[a]; !ok || it.Type != "function_call" {
		t.Errorf("item %s: %+v %v", a, it, ok)
	}
	if _, ok := items["msg_in"]; !ok {
		t.Error("an input item is not found")
	}
	if _, ok := items[b]; ok {
		t.Error("an item the record does not have is found")
	}
}
