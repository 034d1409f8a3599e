package gateway

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/batch"
)

func readHeader(t testing.TB, raw string) *fasthttp.RequestHeader {
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	return &req.Header
}

// Only an upload of known length gets the file limit; everything else keeps
// the body limit (RequestConfig's 0).
func TestUploadHook(t *testing.T) {
	g := &Gateway{cfg: Config{Batches: &batch.Store{}, FileLimit: 1000}}
	for _, tc := range []struct {
		raw  string
		want int
	}{
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 1000 + multipartSlack},
		{"POST /v1/files/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 1000 + multipartSlack},
		{"POST /v1/files?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 0},
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 0},
		{"PUT /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 0},
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 0},
	} {
		if got := g.uploadHook(readHeader(t, tc.raw)).MaxRequestBodySize; got != tc.want {
			t.Errorf("%q: limit %d, want %d", strings.SplitN(tc.raw, "\r\n", 2)[0], got, tc.want)
		}
	}
	if got := (&Gateway{}).uploadHook(readHeader(t, "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")).MaxRequestBodySize; got != 0 {
		t.Errorf("without batches: %d", got)
	}
}

// BenchmarkUploadHook: what the header hook costs a completion request now
// that it also checks for uploads (compare BenchmarkEdgeChecks' FramingHook).
func BenchmarkUploadHook(b *testing.B) {
	h := readHeader(b, "POST /v1/chat/completions HTTP/1.1\r\nHost: api.example.com\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	g := &Gateway{cfg: Config{Batches: &batch.Store{}, FileLimit: 1000}}
	b.Run("framing", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			FramingHook(h)
		}
	})
	b.Run("framing+upload", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g.uploadHook(h)
		}
	})
}
