package gateway

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/batch"
)

func readRequest(t testing.TB, raw string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	return &ctx
}

// Only POST /v1/files, as Fiber routes it, streams its body to its
// handler; every other request is read whole first (bufferBodies).
func TestIsUpload(t *testing.T) {
	g := &Gateway{cfg: Config{Batches: &batch.Store{}, FileLimit: 1000}}
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", true},
		{"POST /v1/files/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", true},
		{"POST /V1/Files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", true},
		{"POST /v1/files?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", true},
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", true},
		{"POST /v1/files// HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", false},
		{"POST /v1/files/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", false},
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", false},
		{"PUT /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", false},
	} {
		if got := g.isUpload(readRequest(t, tc.raw)); got != tc.want {
			t.Errorf("%q: upload %v, want %v", strings.SplitN(tc.raw, "\r\n", 2)[0], got, tc.want)
		}
	}
	if (&Gateway{}).isUpload(readRequest(t, "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")) {
		t.Error("an upload without batches")
	}
}

// The per-tenant and total upload limits: the tenant's own first (429),
// then the gateway's (503); leaving frees the slot, once.
func TestUploadGate(t *testing.T) {
	u := &uploadGate{max: 3, each: 2}
	a1, err := u.enter("a")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := u.enter("a")
	if _, err := u.enter("a"); err == nil || !strings.Contains(err.Error(), "2 uploads in progress") {
		t.Fatalf("third of a: %v", err)
	}
	b1, _ := u.enter("b")
	if _, err := u.enter("c"); err == nil || !strings.Contains(err.Error(), "takes 3 uploads") {
		t.Fatalf("fourth in all: %v", err)
	}
	a1()
	a1() // twice: counted once
	if _, err := u.enter("c"); err != nil {
		t.Fatalf("after one left: %v", err)
	}
	if _, err := u.enter("d"); err == nil {
		t.Fatal("a1 left twice freed two slots")
	}
	a2()
	b1()
}

// The header hook: an upload of known length is streamed to its handler
// after its first bytes (a 1-byte limit: fasthttp reads no further ahead);
// everything else keeps the server's limit (RequestConfig's 0).
func TestUploadHook(t *testing.T) {
	g := &Gateway{cfg: Config{Batches: &batch.Store{}}}
	for _, tc := range []struct {
		raw  string
		want int
	}{
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 1},
		{"POST /V1/files/?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 1},
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 0},
		{"PUT /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 0},
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 0},
	} {
		if got := g.uploadHook(&readRequest(t, tc.raw).Request.Header).MaxRequestBodySize; got != tc.want {
			t.Errorf("%q: limit %d, want %d", strings.SplitN(tc.raw, "\r\n", 2)[0], got, tc.want)
		}
	}
}

// BenchmarkUploadHook: what the header hook costs a completion request now
// that it also checks for uploads (compare BenchmarkEdgeChecks' FramingHook).
func BenchmarkUploadHook(b *testing.B) {
	h := &readRequest(b, "POST /v1/chat/completions HTTP/1.1\r\nHost: api.example.com\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}").Request.Header
	g := &Gateway{cfg: Config{Batches: &batch.Store{}}}
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
