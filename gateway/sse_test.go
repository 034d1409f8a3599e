package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func TestWriteChunkFrame(t *testing.T) {
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
			w := newStreamWriter(&bufConn{Buffer: &out}, false)
			n, err := writeChunkFrame(w, []byte(tc.payload))
			if err != nil || n != tc.events {
				t.Fatalf("n %d err %v", n, err)
			}
			_ = w.Flush()
			if out.String() != tc.want {
				t.Fatalf("got %q want %q", out.String(), tc.want)
			}
		})
	}
	var out bytes.Buffer
	w := newStreamWriter(&bufConn{Buffer: &out}, false)
	_ = writeErrorEvent(w, schemas.Internal("boom"))
	_ = w.Flush()
	want := "data: " + string(schemas.Internal("boom").JSON()) + "\n\ndata: [DONE]\n\n"
	if out.String() != want {
		t.Fatalf("error event %q", out.String())
	}
}

// hideSyscall hides a TCP connection's syscall.Conn so that peerGone takes
// the portable read probe.
type hideSyscall struct{ net.Conn }

// Both probes tell a quiet client from one that hung up, and the peek does
// not consume a byte the client sent.
func TestPeerGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"peek", func(c net.Conn) net.Conn { return c }},
		{"read deadline", func(c net.Conn) net.Conn { return hideSyscall{c} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			cli, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			srv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			conn := tc.wrap(srv)
			// fasthttp's request read deadline expires during long requests.
			_ = srv.SetReadDeadline(time.Now().Add(-time.Second))
			if peerGone(conn) {
				t.Fatal("a quiet client looks gone")
			}
			if tc.name == "peek" {
				_, _ = cli.Write([]byte("G"))
				if peekedBytes(srv) >= 0 { // the byte is there before the probe looks
					testenv.WaitFor(t, time.Second, func() error {
						if n := peekedBytes(srv); n != 1 {
							return fmt.Errorf("%d bytes to peek, want the one sent", n)
						}
						return nil
					})
				}
				if peerGone(conn) {
					t.Fatal("a client with a byte pending looks gone")
				}
				_ = srv.SetReadDeadline(time.Now().Add(time.Second)) // a consumed byte fails here, not after 10 minutes
				buf := make([]byte, 1)
				if n, err := srv.Read(buf); n != 1 || buf[0] != 'G' || err != nil {
					t.Fatalf("the peek consumed data: %d %v", n, err)
				}
			}
			_ = cli.Close()
			testenv.WaitFor(t, time.Second, func() error {
				if !peerGone(conn) {
					return errors.New("the closed client does not look gone")
				}
				return nil
			})
			// The deadline is reset: a later read blocks as usual, with EOF here.
			if tc.name != "peek" {
				if _, err := srv.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("read after probe: %v", err)
				}
			}
		})
	}
}

// BenchmarkSSEWrite measures the SSE write path: chunk frames as they come
// off the bus (parsed, one or two chunk objects each) to bytes in the
// response's stream writer, flushing once per frame as an idle stream does.
func BenchmarkSSEWrite(b *testing.B) {
	for _, bc := range []struct {
		name  string
		lines int
	}{{"1chunk", 1}, {"4chunks", 4}} {
		b.Run(bc.name, func(b *testing.B) {
			payload := []byte(chatHello)
			for i := 1; i < bc.lines; i++ {
				payload = append(append(payload, '\n'), chatWorld...)
			}
			msg := schemas.AppendFrame(nil, schemas.FrameChunk, 7, payload)
			w := newStreamWriter(discardConn{}, false)
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := schemas.ParseFrame(msg)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := writeChunkFrame(w, f.Payload); err != nil {
					b.Fatal(err)
				}
				if err := w.Flush(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

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
