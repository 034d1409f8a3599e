package workers

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// BenchmarkRequest is a worker's work for one forwarded request whose
// engine answers at once: admission, the call (headers, body), accepted,
// one chunk and done frames, the done notice (publishes on a real NATS
// connection, to nobody).
func BenchmarkRequest(b *testing.B) {
	ns := testenv.NATS(b)
	nc := testenv.Connect(b, ns)
	eng := &gateEngine{release: make(chan struct{})}
	close(eng.release)
	w, err := New(Config{ID: "w1", MaxConcurrency: 1 << 30, ChunkLinger: -1}, nc, eng, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"Tell me a story about a cat."}]}`)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		h := nats.Header{schemas.HdrRequestID: {"r-" + strconv.Itoa(i)}, schemas.HdrKind: {"chat"}, schemas.HdrModel: {"m"},
			"Tb-Cancel-Token": {"0123456789abcdef0123456789abcdef"}}
		w.onRequest(&nats.Msg{Subject: "tokenbus.v1.work.w1", Reply: "_INBOX.abc.1", Header: h, Data: body})
	}
	w.wg.Wait() // the requests still finishing

}
