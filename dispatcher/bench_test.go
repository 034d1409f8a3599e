package dispatcher

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// BenchmarkTakeNATSNative is the dispatcher's work for one NATS-native
// request on tokenbus.v1.req.<model>: read the headers and the body, route
// it to a worker with room and forward it (one publish on a real NATS
// connection, to nobody).
func BenchmarkTakeNATSNative(b *testing.B) {
	benchTake(b, []byte(`{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"Tell me a story about a cat."}]}`))
}

// BenchmarkTakeNATSNativePrefix is BenchmarkTakeNATSNative for a chat
// request with a system prompt of about 1100 bytes: keyed and routed by
// prefix, and forwarded with the prediction header (Tb-Prefix-Cached).
func BenchmarkTakeNATSNativePrefix(b *testing.B) {
	benchTake(b, []byte(chatBody("m", longSystem, "Tell me a story about a cat.")))
}

// benchTake measures d.take of body, a chat request for model m, on a
// dispatcher that knows one worker with room.
func benchTake(b *testing.B, body []byte) {
	ns := testenv.NATS(b)
	nc := testenv.Connect(b, ns)
	d := New(Config{}, nc, knownModels{"m": true}, nil, nil)
	hb := []byte(`{"worker":"w","models":["m"],"max_concurrency":1000000000,"healthy":true,"interval_ms":1000}`)
	if _, _, ok := d.fleet.Heartbeat(hb, time.Now()); !ok {
		b.Fatal("heartbeat")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		h := nats.Header{schemas.HdrRequestID: {"r-1"}, schemas.HdrKind: {"chat"}, schemas.HdrMux: {"1"}}
		d.take(&nats.Msg{Subject: "tokenbus.v1.req.m", Reply: "_INBOX.abc.1", Header: h, Data: body}, true)
	}
}
