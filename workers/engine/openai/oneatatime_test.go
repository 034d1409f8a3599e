package openai

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// oneAtATime is a server that runs one request at a time and ends a running
// stream (with [DONE], no finish_reason) whenever another request arrives,
// GET /v1/models included, as a popular CPU server does. A stream sends
// Tokens chunks, one every Every, then a finish_reason and [DONE].
type oneAtATime struct {
	Tokens int
	Every  time.Duration

	mu  sync.Mutex
	cut chan struct{} // closed to interrupt the running stream
	// Interrupts counts streams cut by another request.
	Interrupts int
}

func (s *oneAtATime) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.cut != nil {
		close(s.cut)
		s.cut = nil
	}
	mine := make(chan struct{})
	if r.URL.Path == "/v1/chat/completions" {
		s.cut = mine
	}
	s.mu.Unlock()
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"base","object":"model"}]}`)
	case "/v1/chat/completions":
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(s.Every)
		defer tick.Stop()
		for i := 0; i < s.Tokens; i++ {
			select {
			case <-r.Context().Done():
				return
			case <-mine:
				s.mu.Lock()
				s.Interrupts++
				s.mu.Unlock()
				fmt.Fprint(w, "data: [DONE]\n\n")
				return
			case <-tick.C:
				fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"finish_reason\":null}]}\n\n", i)
				w.(http.Flusher).Flush()
			}
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
		s.mu.Lock()
		if s.cut == mine {
			s.cut = nil
		}
		s.mu.Unlock()
	default:
		http.NotFound(w, r)
	}
}

// With the default settings (a health check every second), a long stream
// through a server that serves one request at a time is not cut by the
// engine's own probes or model refreshes: all 250 tokens arrive.
func TestOneAtATimeServerStreamsWhole(t *testing.T) {
	f := &oneAtATime{Tokens: 250, Every: 10 * time.Millisecond} // 2.5s: two health periods and more
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	e, err := New(Config{URL: srv.URL, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	sink := &tokenSink{}
	req := &engine.Request{ID: "long", Kind: schemas.KindChat, Model: "base",
		Body: []byte(`{"model":"base","messages":[{"role":"user","content":"hi"}],"stream":true}`)}
	if _, err := e.Generate(ctx, req, sink); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	cut := f.Interrupts
	f.mu.Unlock()
	if cut != 0 || sink.tokens < 250 || !sink.finished {
		t.Fatalf("%d tokens arrived (finish_reason seen: %v), stream cut %d times", sink.tokens, sink.finished, cut)
	}
	// Idle, the server is probed again.
	testenv.WaitFor(t, 5*time.Second, func() error { return e.Health(t.Context()) })
}

// tokenSink counts content chunks and notes a finish_reason.
type tokenSink struct {
	tokens   int
	finished bool
}

func (s *tokenSink) Chunks(b []byte) error {
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(l, `"content"`) {
			s.tokens++
		}
		if strings.Contains(l, `"finish_reason":"`) {
			s.finished = true
		}
	}
	return nil
}
