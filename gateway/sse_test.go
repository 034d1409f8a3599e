package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

// BenchmarkStreamEndToEnd streams chunks from a fake worker over the embedded
// NATS server, through the client and the gateway, to an HTTP client reading
// the SSE body: the whole per-token path on one machine. One op is one request
// of 256 chunk frames; ns/chunk is reported.
func BenchmarkStreamEndToEnd(b *testing.B) {
	const chunks = 256
	h := newHarness(b, harnessOptions{worker: func(h *harness, m *nats.Msg) {
		h.accept(m)
		frame := make([]byte, 0, 512)
		for i := 0; i < chunks; i++ {
			frame = schemas.AppendFrame(frame[:0], schemas.FrameChunk, uint64(i+2), []byte(chatHello))
			_ = h.wc.Publish(m.Reply, frame)
		}
		h.reply(m, schemas.FrameDone, chunks+2, doneChat)
	}})
	go func() { // drain the record of requests
		for range h.reqs {
		}
	}()
	want := chunks*len("data: "+chatHello+"\n\n") + len("data: [DONE]\n\n")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodPost, h.base+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Content-Type", "application/json")
		resp, err := h.http.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != int64(want) {
			b.Fatalf("read %d bytes, %v", n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
}

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "Application/JSON": true, "application/json; charset=utf-8": true,
		"application/json;": true, " application/json ": true,
		"": false, "text/plain": false, "application/jsonl": false, "application/x-www-form-urlencoded": false,
	} {
		if isJSON(ct) != want {
			t.Errorf("isJSON(%q) = %v", ct, !want)
		}
	}
}

// BenchmarkParseRequest: what the gateway spends reading a chat body of about
// 64 KiB and copying it for the bus.
func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"messages":[` +
		strings.Repeat(`{"role":"user","content":"`+strings.Repeat("lorem ipsum ", 40)+`"},`, 128) +
		`{"role":"user","content":"hi"}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		r, err := schemas.ReadRequest(schemas.KindChat, body, "")
		if err != nil || !r.Stream {
			b.Fatal(err)
		}
		_ = payload(r)
	}
}
