package workers

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
	"github.com/tokenbus/tokenbus/workers/engine/openai"
)

// A stream the engine cuts before any finish_reason (over real HTTP, the
// openai engine) ends in an error frame engine_stream_truncated and is not
// recorded in usage; the next, whole, stream is.
func TestTruncatedStreamNotRecorded(t *testing.T) {
	f := fakevllm.New()
	f.AnyModel = true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Request-Id") == "cut" { // this one is cut: no finish_reason, then [DONE]
			body, _ := io.ReadAll(r.Body)
			body = bytes.Replace(body, []byte("{"), []byte(`{"x_fake":{"mode":"truncate_done"},`), 1)
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	eng, err := openai.New(openai.Config{URL: srv.URL, Models: []string{"m"}, RequestID: httpengine.RequestIDRaw,
		HealthInterval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	testenv.WaitFor(t, 5*time.Second, func() error { return eng.Health(t.Context()) })

	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	log := &usageLog{}
	startWorker(t, nc, eng, Config{ID: "w1", Usage: log})
	key := map[string]string{schemas.HdrKeyID: "key_a", schemas.HdrTenant: "tenant-a"}

	cut := send(t, nc, schemas.WorkSubject("w1"), "cut", key)
	testenv.WaitFor(t, 5*time.Second, lastIs(cut, schemas.FrameError))
	if e := schemas.ParseErrorPayload(cut.last().Payload); e.Status != 502 || e.Body.Code == nil || *e.Body.Code != schemas.CodeEngineTruncated {
		t.Fatalf("error %+v, want 502 %s", e, schemas.CodeEngineTruncated)
	}
	whole := send(t, nc, schemas.WorkSubject("w1"), "whole", key)
	testenv.WaitFor(t, 5*time.Second, lastIs(whole, schemas.FrameDone))
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := len(log.all()); n == 0 {
			return fmt.Errorf("no usage record yet")
		}
		return nil
	})
	if recs := log.all(); len(recs) != 1 || recs[0].RequestID != "whole" {
		t.Fatalf("usage records %+v: want only the whole stream's", recs)
	}
}

func lastIs(f *frames, want schemas.FrameType) func() error {
	return func() error {
		if got := f.types(); len(got) == 0 || got[len(got)-1] != want {
			return fmt.Errorf("frames %v, want the last %v", got, want)
		}
		return nil
	}
}
