package httpstream

import (
	"bytes"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestWriteEvents(t *testing.T) {
	for _, tc := range []struct {
		name, payload, want string
		events              int
	}{
		{"one", `{"a":1}`, "data: {\"a\":1}\n\n", 1},
		{"two lines", "{\"a\":1}\n{\"b\":2}", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n", 2},
		{"trailing and blank lines", "\n{\"a\":1}\n\n{\"b\":2}\n", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n", 2},
		{"empty", "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := testStream(&bufConn{Buffer: &out}, false, "")
			n, err := w.WriteEvents([]byte(tc.payload))
			if err != nil || n != tc.events {
				t.Fatalf("n %d err %v", n, err)
			}
			_ = w.Flush()
			if out.String() != tc.want {
				t.Fatalf("got %q want %q", out.String(), tc.want)
			}
		})
	}
}

func TestFailEvent(t *testing.T) {
	var out bytes.Buffer
	w := testStream(&bufConn{Buffer: &out}, false, "")
	if err := w.Fail(schemas.ErrInternal.New("boom")); err != nil {
		t.Fatal(err)
	}
	want := "data: " + string(schemas.ErrInternal.New("boom").JSON()) + "\n\ndata: [DONE]\n\n"
	if out.String() != want {
		t.Fatalf("error event %q", out.String())
	}
	if w.state.Load() != stateEnded {
		t.Fatal("a stream ended by Fail may not be reused")
	}
}

// Done and Fail end the body; before Run they would overtake a response
// fasthttp may still hold, so they refuse and write nothing.
func TestEndBeforeRun(t *testing.T) {
	var out bytes.Buffer
	w := testStream(&bufConn{Buffer: &out}, true, "HEAD\r\n\r\n")
	w.running = false
	if err := w.Done(); err != errNotRunning {
		t.Fatalf("Done before Run: %v", err)
	}
	if err := w.Fail(schemas.ErrInternal.New("boom")); err != errNotRunning {
		t.Fatalf("Fail before Run: %v", err)
	}
	if out.Len() != 0 || len(w.buf) != w.hlen+chunkHeadroom {
		t.Fatalf("wrote %q, buffered %d bytes", out.String(), len(w.buf)-w.hlen-chunkHeadroom)
	}
}

// benchChunkLine is an OpenAI chat chunk of a typical size (~230 bytes).
const benchChunkLine = `{"id":"chatcmpl-8f2c1d9e4b7a4c3e9d1f0a2b","object":"chat.completion.chunk","created":1735689600,"model":"meta-llama/Llama-3.1-8B-Instruct","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`

// The chunks of BenchmarkSSEWrite (the gateway's test chunks, so that its
// figures compare with those of the benchmark's earlier home there).
const (
	sseHello = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`
	sseWorld = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama-8b","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]}`
)

// BenchmarkSSEWrite measures the SSE write path: chunk frames as they come
// off the bus (parsed, one or four chunk objects each) to bytes in the
// stream's buffer, flushing once per frame as an idle stream does.
func BenchmarkSSEWrite(b *testing.B) {
	for _, bc := range []struct {
		name  string
		lines int
	}{{"1chunk", 1}, {"4chunks", 4}} {
		b.Run(bc.name, func(b *testing.B) {
			payload := []byte(sseHello)
			for i := 1; i < bc.lines; i++ {
				payload = append(append(payload, '\n'), sseWorld...)
			}
			msg := schemas.AppendFrame(nil, schemas.FrameChunk, 7, payload)
			w := testStream(discardConn{}, false, "")
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := schemas.ParseFrame(msg)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.WriteEvents(f.Payload); err != nil {
					b.Fatal(err)
				}
				if err := w.Flush(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
