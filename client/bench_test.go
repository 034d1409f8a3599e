package client

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// BenchmarkClientStream: the client's per-token path alone. A fake worker
// publishes 256 chunk frames to one stream over the embedded NATS server;
// the reader takes them with Next. One op is one request; ns/chunk is
// reported. (The gateway's BenchmarkStreamEndToEnd adds SSE and HTTP.)
func BenchmarkClientStream(b *testing.B) {
	const chunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}`
	benchStream(b, chunk, chunk)
}

// BenchmarkClientStreamTokenIDs: the same with vLLM's chunks, which name
// token ids. unasked: the ids null (vLLM not asked: what the reader gets);
// stripped: vLLM asked for them (return_token_ids), the client recording
// them for a migration and setting them to null for the reader. The
// difference is what exact migration costs per token.
func BenchmarkClientStreamTokenIDs(b *testing.B) {
	const (
		head  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,`
		first = head + `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":%s}`
		chunk = head + `"delta":{"content":" hello"},"logprobs":null,"finish_reason":null,"token_ids":%s}]}`
	)
	b.Run("unasked", func(b *testing.B) {
		benchStream(b, fmt.Sprintf(first, "null"), fmt.Sprintf(chunk, "null"))
	})
	b.Run("stripped", func(b *testing.B) {
		benchStream(b, fmt.Sprintf(first, "[128000,9906,11,1268,527,499,30]"), fmt.Sprintf(chunk, "[24748]"))
	})
}

// benchStream streams first and 255 times chunk to each request.
func benchStream(b *testing.B, first, chunk string) {
	const chunks = 256
	ns := testenv.NATS(b)
	nc := testenv.Connect(b, ns)
	wc := testenv.Connect(b, ns)
	if _, err := wc.Subscribe(schemas.ReqPrefix+">", func(m *nats.Msg) {
		frame := schemas.AppendFrame(nil, schemas.FrameAccepted, 1, []byte(`{"request_id":"r","worker":"w","cancel":"c"}`))
		_ = wc.Publish(m.Reply, frame)
		for i := range chunks {
			c := chunk
			if i == 0 {
				c = first
			}
			frame = schemas.AppendFrame(frame[:0], schemas.FrameChunk, uint64(i+2), []byte(c))
			_ = wc.Publish(m.Reply, frame)
		}
		_ = wc.Publish(m.Reply, schemas.AppendFrame(frame[:0], schemas.FrameDone, chunks+2, []byte(`{"usage":{}}`)))
	}); err != nil {
		b.Fatal(err)
	}
	if err := wc.Flush(); err != nil {
		b.Fatal(err)
	}
	c, err := New(nc, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		st, err := c.Start(&Request{ID: "r", Kind: schemas.KindChat, Model: "m", Body: body})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			f, err := st.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if f.Type == schemas.FrameDone {
				break
			}
			n++
		}
		st.Close()
		if n != chunks {
			b.Fatalf("%d chunks", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
}
