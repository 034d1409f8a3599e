package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// A request's flow: the key's tenant, band, weight and queue limit; without
// a key, the "user" field only where the operator allows it, and only a
// user that can travel as a header value.
func TestFlow(t *testing.T) {
	key := Principal{Tenant: "acme", Band: schemas.BandBatch, Weight: 3, MaxQueue: 2 * time.Second}
	for _, tc := range []struct {
		name     string
		fromUser bool
		p        Principal
		user     string
		want     client.Request
	}{
		{"a key's flow", false, key, "u1", client.Request{Tenant: "acme", Band: schemas.BandBatch, Weight: 3, MaxQueue: 2 * time.Second}},
		{"a key wins over the user field", true, key, "u1", client.Request{Tenant: "acme", Band: schemas.BandBatch, Weight: 3, MaxQueue: 2 * time.Second}},
		{"no key, user not allowed", false, Principal{}, "u1", client.Request{}},
		{"no key, user allowed", true, Principal{}, "u1", client.Request{Tenant: "user:u1"}},
		{"no key, empty user", true, Principal{}, "", client.Request{}},
		{"no key, user with a newline", true, Principal{}, "a\r\nTb-Band: critical", client.Request{}},
		{"no key, user too long", true, Principal{}, strings.Repeat("x", 65), client.Request{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Gateway{cfg: Config{FlowFromUser: tc.fromUser}}
			var r client.Request
			g.flow(&r, tc.p, tc.user)
			if r.Tenant != tc.want.Tenant || r.Band != tc.want.Band || r.Weight != tc.want.Weight || r.MaxQueue != tc.want.MaxQueue {
				t.Errorf("got %+v, want %+v", r, tc.want)
			}
		})
	}
}
