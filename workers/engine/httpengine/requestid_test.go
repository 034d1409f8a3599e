package httpengine

import (
	"fmt"
	"testing"
)

// X-Request-Id as Config.RequestID says: raw, a UUID (made from the id, the
// same each time, or the id itself when it is one), or none.
func TestRequestIDHeader(t *testing.T) {
	f, srv := startFake(t)
	f.AnyModel = true
	const given = "0b5a7c2e-9d51-4f6e-8a3b-2c1d0e9f8a7b"
	for _, tc := range []struct {
		format, id, want string
	}{
		{RequestIDRaw, "req-raw", "req-raw"},
		{RequestIDUUID, "req-uuid", RequestUUID("req-uuid")},
		{RequestIDUUID, given, given},
		{RequestIDOff, "req-off", ""},
	} {
		t.Run(tc.format+" "+tc.id, func(t *testing.T) {
			cfg := fastConfig(srv.URL)
			cfg.RequestID = tc.format
			e := newEngine(t, cfg)
			req := chat(`{"model":"base","x_fake":{"chunks":1}}`)
			req.ID = tc.id
			if _, err := e.Generate(t.Context(), req, &recSink{}); err != nil {
				t.Fatal(err)
			}
			key := tc.want // the fake keys requests by X-Request-Id, else fake-<n>
			if key == "" {
				key = fmt.Sprintf("fake-%d", f.Requests())
			}
			h := f.Header(key)
			if h == nil || h.Get("X-Request-Id") != tc.want {
				t.Errorf("no request with X-Request-Id %q arrived (headers %v)", tc.want, h)
			}
		})
	}
	if u := RequestUUID("req-1"); !isUUID(u) || u[14] != '5' || u != RequestUUID("req-1") || u == RequestUUID("req-2") {
		t.Errorf("RequestUUID(req-1) = %q: want a stable version-5 UUID, distinct per id", u)
	}
	if _, err := New("test", Config{URL: srv.URL, RequestID: "hex"}, Hooks{}); err == nil {
		t.Error("an unknown request id format was accepted")
	}
}
