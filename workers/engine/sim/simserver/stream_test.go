package simserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClientGone: a client that leaves mid-request, streaming or not, takes
// its request out of the sim's batch.
func TestClientGone(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := "whole"
		if stream {
			name = "stream"
		}
		t.Run(name, func(t *testing.T) {
			ts := start(t, Config{}, slowSim())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := `{"prompt":"hi","max_tokens":5000,"ignore_eos":true}`
			if stream {
				body = strings.Replace(body, "}", `,"stream":true}`, 1)
			}
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			running(t, ts.eng, 1)
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("client: %v", err)
			}
			aborted(t, ts.eng, 1)
		})
	}
}

// TestHeadersWhileQueued: a stream's headers go out once the sim accepts the
// request, before its first token, as vLLM sends them: a queued request does
// not look stalled.
func TestHeadersWhileQueued(t *testing.T) {
	sc := slowSim()
	sc.MaxNumSeqs = 1
	ts := start(t, Config{}, sc)
	long := do(t, http.MethodPost, ts.url+"/v1/completions", `{"prompt":"hi","max_tokens":5000,"ignore_eos":true,"stream":true}`)
	defer long.Body.Close()
	firstEvent(t, long)
	queued := do(t, http.MethodPost, ts.url+"/v1/completions", `{"prompt":"hi","max_tokens":3,"stream":true}`)
	defer queued.Body.Close()
	if st := ts.eng.Stats(); queued.StatusCode != 200 || st.Waiting != 1 || st.Running != 1 {
		t.Fatalf("status %d with stats %+v: want the headers of a queued request", queued.StatusCode, st)
	}
}

// TestConcurrentStreams: many streams at once, each framed whole and with
// its own id.
func TestConcurrentStreams(t *testing.T) {
	ts := start(t, Config{}, fastSim())
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			id := fmt.Sprintf("c%d", i)
			resp := do(t, http.MethodPost, ts.url+"/v1/chat/completions",
				`{"messages":[{"role":"user","content":"hi"}],"max_tokens":50,"n":2,"stream":true,"stream_options":{}}`, "X-Request-Id", id)
			events := sse(t, resp)
			for _, ev := range events {
				if !strings.Contains(ev, `"id":"chatcmpl-`+id+`"`) {
					t.Errorf("event of another request in %s: %s", id, ev)
					return
				}
			}
			if !strings.Contains(events[len(events)-1], `"usage":{`) {
				t.Errorf("%s: no usage at the end", id)
			}
		})
	}
	wg.Wait()
}

// TestSlowClient: output that piles up past MaxPendingBytes fails the sink,
// which makes the sim abort the request.
func TestSlowClient(t *testing.T) {
	ts := start(t, Config{MaxPendingBytes: 100}, fastSim())
	k := ts.getSink()
	k.start = time.Now()
	if err := k.Chunks([]byte(`{"a":1}` + "\n" + `{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	if got := string(k.swap(nil)); got != "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n" {
		t.Errorf("events %q", got)
	}
	if err := k.Chunks([]byte(strings.Repeat("x", 101))); !errors.Is(err, errSlowClient) {
		t.Errorf("past the limit: %v", err)
	}
	if err := k.Chunks([]byte("{}")); !errors.Is(err, errSlowClient) {
		t.Errorf("after failing: %v", err)
	}
}
