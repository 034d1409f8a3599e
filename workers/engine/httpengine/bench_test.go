package httpengine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// sseBody is a vLLM-like chat stream of n content chunks, a usage chunk and [DONE].
func sseBody(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word%d"},"logprobs":null,"finish_reason":null}]}`+"\n\n", i)
	}
	b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":256,"total_tokens":265}}` + "\n\ndata: [DONE]\n\n")
	return b.String()
}

type nopSink struct{ calls, bytes int }

func (s *nopSink) Chunks(b []byte) error { s.calls++; s.bytes += len(b); return nil }

// The SSE reader alone, from memory: the per-chunk cost of the pass-through.
func BenchmarkSSEParse(b *testing.B) {
	body := sseBody(256)
	r := strings.NewReader(body)
	br := bufio.NewReaderSize(r, readerSize)
	s := sseState{maxLine: 1 << 20}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(body)
		br.Reset(r)
		var sink nopSink
		if err := s.run(br, &sink); err != errDone {
			b.Fatal(err)
		}
		if u, _ := s.usage(); u.CompletionTokens != 256 {
			b.Fatal("usage")
		}
		s.last, s.counted = s.last[:0], 0
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*257), "ns/chunk")
}

// A whole request over loopback HTTP: a server writing 256 chunks as fast as
// it can (each flushed on its own, as vLLM does), the engine reading them.
// The server is purpose-built, not the fake vLLM: it writes pre-rendered
// events, so that its own cost stays out of the engine's per-chunk figure.
func BenchmarkStreamHTTP(b *testing.B) {
	body := sseBody(256)
	events := strings.SplitAfter(body, "\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for _, ev := range events {
			io.WriteString(w, ev)
			fl.Flush()
		}
	}))
	defer srv.Close()
	e := newEngine(b, fastConfig(srv.URL))
	req := chat(`{"model":"base","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	var calls int
	b.ReportAllocs()
	for b.Loop() {
		var sink nopSink
		if _, err := e.Generate(b.Context(), req, &sink); err != nil {
			b.Fatal(err)
		}
		calls += sink.calls
	}
	b.ReportMetric(float64(calls)/float64(b.N), "sinkcalls/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*257), "ns/chunk")
}

// Finished streams give their connection back: sequential requests share
// one or two, not a connection each.
func TestConnectionReuse(t *testing.T) {
	f, _ := startFake(t)
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(f)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	cfg := fastConfig(srv.URL)
	cfg.HealthInterval = 1 << 40 // one probe only
	e := newEngine(t, cfg)
	healthy(t, e)
	if _, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true}`), &recSink{}); err != nil {
		t.Fatal(err)
	}
	// The first model refresh, after the probe, opens its connection first.
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := f.ModelsRequests(); n < 2 {
			return fmt.Errorf("%d GET /v1/models, want the probe's and the refresh's", n)
		}
		return nil
	})
	before := conns.Load()
	for i := range 40 {
		// As the worker does: the request's context ends when Generate returns.
		ctx, cancel := context.WithCancel(t.Context())
		body := `{"model":"base","stream":true}`
		if i%2 == 1 {
			body = `{"model":"base"}`
		}
		_, err := e.Generate(ctx, chat(body), &recSink{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The end of a stream is read in the background, so the next request may
	// start before its connection is back: allow a second connection or so.
	if n := conns.Load() - before; n > 2 {
		t.Errorf("40 sequential requests opened %d new connections", n)
	}
}
