package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/responses"
)

// Issue 32, findings 2 and 6: what tenants share in the Responses API (the
// events stream's consumers, the runner's slots, JetStream's room) against
// tokenbus dev with API keys on a real redis-server, its embedded
// nats-server, real HTTP.

// sseStream is one streamed answer, read event by event.
type sseStream struct {
	res   *http.Response
	sc    *bufio.Scanner
	start time.Time
}

// openStream sends a request expecting SSE; a non-200 answer is returned
// with its body in err.
func openStream(t testing.TB, method, url, key, body string, hdr ...string) (*sseStream, int, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	start := time.Now()
	res, err := httpClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return nil, res.StatusCode, fmt.Errorf("%d %s (Retry-After %q): %s", res.StatusCode, res.Status, res.Header.Get("Retry-After"), b)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &sseStream{res: res, sc: sc, start: start}, 200, nil
}

// next is the next data payload; "" at the end of the body.
func (s *sseStream) next() string {
	for s.sc.Scan() {
		if data, ok := strings.CutPrefix(s.sc.Text(), "data: "); ok {
			return data
		}
	}
	return ""
}

// rest reads every data payload left.
func (s *sseStream) rest() []string {
	var out []string
	for d := s.next(); d != ""; d = s.next() {
		out = append(out, d)
	}
	return out
}

func (s *sseStream) close() { s.res.Body.Close() }

func chatBody(maxTokens int) string {
	return fmt.Sprintf(`{"model":"llama-8b","max_tokens":%d,"ignore_eos":true,"stream":true,"messages":[{"role":"user","content":"x"}]}`, maxTokens)
}

// resumable starts a resumable chat stream.
func resumable(t testing.TB, base, key string, maxTokens int) (*sseStream, int, error) {
	t.Helper()
	return openStream(t, "POST", base+"/v1/chat/completions", key, chatBody(maxTokens), "Tokenbus-Resumable", "true")
}

// eventsConsumers counts the consumers on the events stream.
func eventsConsumers(t testing.TB, js jetstream.JetStream) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, responses.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// sharedDev is tokenbus dev with API keys (a real redis-server) and a
// 20 ms-a-token sim, with configure applied; keys for tenants acme and
// beta.
func sharedDev(t *testing.T, configure ...func(*program.DevConfig)) (d *dev, rd *testenv.Redis, acme, beta string) {
	t.Helper()
	rd = testenv.StartRedis(t)
	d = startDev(t, append([]func(*program.DevConfig){func(c *program.DevConfig) {
		c.Redis.URL, c.HTTP.Auth, c.HTTP.AdminToken = rd.URL, true, limitsAdminToken
		c.HTTP.Limits.Breaker.Timeout = patientBreaker
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = 20*time.Millisecond, time.Millisecond
	}}, configure...)...)
	_, acme = newKey(t, d, `{"name":"a","tenant":"acme"}`)
	_, beta = newKey(t, d, `{"name":"b","tenant":"beta"}`)
	return d, rd, acme, beta
}

// TestResponsesConsumerFlood (finding 2): one tenant's flood of follows
// that end (resumable streams with max_tokens 1, and resumes of an ended
// one: each a consumer on the events stream) leaves no consumer behind,
// and another tenant's resumable stream and streamed background response
// still get their events. Before: each follow's consumer lingered 5
// minutes, the server's 1,000 per stream ran out, and every tenant's
// follows answered 200 with no events.
func TestResponsesConsumerFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 1,300 follows")
	}
	t.Parallel()
	d, _, acme, beta := sharedDev(t)
	js, err := jetstream.New(connectNATS(t, d.NATSURL))
	if err != nil {
		t.Fatal(err)
	}
	// One ended stream to resume again and again.
	s, st, err := resumable(t, d.URL, acme, 1)
	if err != nil {
		t.Fatalf("resumable: %d %v", st, err)
	}
	sid := s.res.Header.Get("Tokenbus-Stream-Id")
	if ev := s.rest(); len(ev) == 0 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("the first stream: %v", ev)
	}
	s.close()

	const streams, resumes, workers = 200, 1100, 16
	var next, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > streams+resumes {
					return
				}
				var s *sseStream
				var err error
				if i <= streams {
					s, _, err = resumable(t, d.URL, acme, 1)
				} else {
					s, _, err = openStream(t, "POST", d.URL+"/v1/chat/completions", acme, chatBody(1), "Tokenbus-Resumable", "true", "Last-Event-ID", sid+":0")
				}
				if err == nil {
					if ev := s.rest(); len(ev) == 0 || ev[len(ev)-1] != "[DONE]" {
						err = fmt.Errorf("follow %d: %v", i, ev)
					}
					s.close()
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d resumable streams (max_tokens 1) and %d resumes by acme in %v; %d failed", streams, resumes, time.Since(start).Round(time.Millisecond), failed.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of acme's own follows failed, first: %v", n, firstErr.Load())
	}
	// Every follow has ended: its consumer is gone (the runners read with
	// direct gets and hold none).
	testenv.WaitFor(t, 10*time.Second, func() error {
		if n := eventsConsumers(t, js); n > 0 {
			return fmt.Errorf("%d consumers left on %s", n, responses.EventStream)
		}
		return nil
	})

	// Another tenant: its resumable stream and streamed background
	// response get their events.
	s, st, err = resumable(t, d.URL, beta, 5)
	if err != nil {
		t.Fatalf("beta's resumable stream: %d %v", st, err)
	}
	if ev := s.rest(); len(ev) < 2 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("beta's resumable stream: %v", ev)
	}
	s.close()
	s, st, err = openStream(t, "POST", d.URL+"/v1/responses", beta, `{"model":"llama-8b","input":"hi","max_output_tokens":3,"background":true,"stream":true}`)
	if err != nil {
		t.Fatalf("beta's background response: %d %v", st, err)
	}
	ev := s.rest()
	s.close()
	if len(ev) == 0 || !strings.Contains(ev[len(ev)-1], `"response.completed"`) && !strings.Contains(ev[len(ev)-1], `"response.incomplete"`) {
		t.Fatalf("beta's background response: %v", ev)
	}
	if n := eventsConsumers(t, js); n > 0 {
		t.Errorf("%d consumers left after beta's follows", n)
	}
}

// TestResponseFollowCaps (finding 2): follows are bounded per tenant (429)
// and per gateway (503), with Retry-After, before anything is answered;
// and when JetStream refuses the follow's consumer the client gets an
// error status, never a 200 with no events.
func TestResponseFollowCaps(t *testing.T) {
	t.Parallel()
	d, _, acme, beta := sharedDev(t, func(c *program.DevConfig) {
		c.HTTP.Responses.MaxFollowsPerTenant, c.HTTP.Responses.MaxFollows = 2, 3
	})
	var open []*sseStream
	hold := func(key string) {
		t.Helper()
		s, st, err := resumable(t, d.URL, key, 2000)
		if err != nil {
			t.Fatalf("follow %d: %d %v", len(open)+1, st, err)
		}
		if s.next() == "" {
			t.Fatal("no first event")
		}
		open = append(open, s)
	}
	refused := func(key string, status int, code string) {
		t.Helper()
		_, st, err := resumable(t, d.URL, key, 5)
		if st != status || err == nil || !strings.Contains(err.Error(), `"code":"`+code+`"`) || !strings.Contains(err.Error(), `Retry-After "1"`) {
			t.Fatalf("past the cap: %d %v, want %d %s with Retry-After", st, err, status, code)
		}
	}
	hold(acme)
	hold(acme)
	refused(acme, 429, "too_many_follows") // acme's 2
	hold(beta)
	refused(beta, 503, "follows_unavailable") // the gateway's 3
	open[0].close()
	testenv.WaitFor(t, 5*time.Second, func() error {
		s, st, err := resumable(t, d.URL, acme, 1)
		if err != nil {
			return fmt.Errorf("%d %v", st, err)
		}
		s.rest()
		s.close()
		return nil
	})
	for _, s := range open[1:] {
		s.close()
	}

	// JetStream refuses the consumer (here: the stream allows none): an
	// error status, and nothing queued.
	js, err := jetstream.New(connectNATS(t, d.NATSURL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	es, err := js.Stream(ctx, responses.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 40*time.Second, func() error { // the closed follows' consumers go
		if n := eventsConsumers(t, js); n > 0 {
			return fmt.Errorf("%d consumers", n)
		}
		return nil
	})
	cfg := es.CachedInfo().Config
	cfg.MaxConsumers = 1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	blocker, err := es.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{responses.EventPrefix + "nothing"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = blocker
	_, st, err := resumable(t, d.URL, beta, 5)
	if st != 503 || err == nil || !strings.Contains(err.Error(), "follows_unavailable") {
		t.Fatalf("with no consumer to be had: %d %v, want 503 follows_unavailable", st, err)
	}
	_, st, err = openStream(t, "POST", d.URL+"/v1/responses", beta, `{"model":"llama-8b","input":"hi","background":true,"stream":true}`)
	if st != 503 || err == nil {
		t.Fatalf("a streamed background response with no consumer to be had: %d %v, want 503", st, err)
	}
}

// TestStoredResponseNotLost (findings 4 and 6): a store:true response that
// JetStream cannot store is an error to its client (503, or an error event
// in place of response.completed), not a 200 that is 404 afterwards.
func TestStoredResponseNotLost(t *testing.T) {
	t.Parallel()
	d, _, acme, _ := sharedDev(t)
	js, err := jetstream.New(connectNATS(t, d.NATSURL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.Stream(ctx, "KV_"+responses.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := kv.CachedInfo().Config
	full := cfg
	full.MaxBytes = 64 // no record fits
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	var r struct{ ID string }
	st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"llama-8b","input":"hi","max_output_tokens":3}`), &r, "Authorization", "Bearer "+acme)
	if err != nil {
		t.Fatal(err)
	}
	if st == 200 {
		st2, b2, _ := httpJSON("GET", d.URL+"/v1/responses/"+r.ID, "", nil, nil, "Authorization", "Bearer "+acme)
		t.Fatalf("store:true with the bucket full: 200 %s; then GET: %d %s", b, st2, b2)
	}
	if st != 503 || errorBody(t, string(b)).Code == nil || *errorBody(t, string(b)).Code != "responses_unavailable" {
		t.Fatalf("store:true with the bucket full: %d %s, want 503 responses_unavailable", st, b)
	}
	s, st, err := openStream(t, "POST", d.URL+"/v1/responses", acme, `{"model":"llama-8b","input":"hi","max_output_tokens":3,"stream":true}`)
	if err != nil {
		t.Fatalf("streamed: %d %v", st, err)
	}
	ev := s.rest()
	s.close()
	if len(ev) == 0 || !strings.Contains(ev[len(ev)-1], `"type":"error"`) || !strings.Contains(ev[len(ev)-1], "responses_unavailable") {
		t.Fatalf("streamed store:true with the bucket full ended with %v, want an error event", ev[max(0, len(ev)-1):])
	}
	// Room again: stored, and there afterwards.
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	st, b, err = httpJSON("POST", d.URL+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"llama-8b","input":"hi","max_output_tokens":3}`), &r, "Authorization", "Bearer "+acme)
	if st != 200 || err != nil {
		t.Fatalf("with room: %d %v %s", st, err, b)
	}
	if st, b, _ := httpJSON("GET", d.URL+"/v1/responses/"+r.ID, "", nil, nil, "Authorization", "Bearer "+acme); st != 200 {
		t.Fatalf("GET after a 200: %d %s", st, b)
	}
}

// TestResponseNotDropped (finding 2): a background response whose runs
// keep failing (JetStream refusing its events for longer than the old 20
// deliveries) is not dropped: once there is room it ends, and its
// follower sees the end.
func TestResponseNotDropped(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 7 s of refusals, then 8 s to the next delivery")
	}
	t.Parallel()
	d, _, acme, _ := sharedDev(t, func(c *program.DevConfig) { c.HTTP.Responses.RunnerMaxAttempts = 2 })
	js, err := jetstream.New(connectNATS(t, d.NATSURL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	es, err := js.Stream(ctx, responses.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := es.CachedInfo().Config
	full := cfg
	full.MaxBytes, full.Discard = 1, jetstream.DiscardNew // no event fits, none is dropped
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	var r struct{ ID string }
	if st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"llama-8b","input":"hi","max_output_tokens":3,"background":true}`), &r, "Authorization", "Bearer "+acme); st != 200 || err != nil {
		t.Fatalf("create: %d %v %s", st, err, b)
	}
	// Its follower (whose answer's headers come with the first event).
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	events := make(chan []string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(fctx, "GET", d.URL+"/v1/responses/"+r.ID+"?stream=true", nil)
		req.Header.Set("Authorization", "Bearer "+acme)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			events <- []string{err.Error()}
			return
		}
		defer res.Body.Close()
		s := &sseStream{res: res, sc: bufio.NewScanner(res.Body)}
		events <- s.rest()
	}()
	// Past MaxAttempts (2): the first run fails and is retried 1 s later;
	// from the second on, each run fails to end it (JetStream refuses the
	// failed event too) and keeps it queued, delivered again 2 s, then 4 s
	// later: the fourth delivery, the third kept past MaxAttempts, comes
	// about 7 s in. (Before: MaxAttempts 3 and a timed 25 s, three kept.)
	ws, err := js.Stream(ctx, responses.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() error {
		var n uint64
		l := ws.ListConsumers(ctx)
		for ci := range l.Info() {
			n += ci.Delivered.Consumer
		}
		if l.Err() != nil {
			return l.Err()
		}
		if n < 4 {
			return fmt.Errorf("the response was delivered %d times, want 4", n)
		}
		return nil
	})
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		last := ""
		if len(ev) > 0 {
			last = ev[len(ev)-1]
		}
		if !strings.Contains(last, `"response.completed"`) && !strings.Contains(last, `"response.incomplete"`) && !strings.Contains(last, `"response.failed"`) {
			t.Fatalf("the follower's last event: %q", last)
		}
		t.Logf("ended with %.80s", last)
	case <-time.After(90 * time.Second):
		t.Fatal("the response never ended once JetStream had room: dropped")
	}
}

// TestResponsesRunnerFairness (finding 6): acme floods the runner (20
// resumable streams it abandons, 250 background responses); beta's
// resumable stream's first token and its 3-token background response come
// within a bound far below the flood's length.
// Not parallel: a flood, and bounds of 3 s and 5 s on beta's wait behind it.
func TestResponsesRunnerFairness(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a flood")
	}
	d, _, acme, beta := sharedDev(t)
	floodStart := time.Now()
	// 20 long streams (40 s each), abandoned: they run on. (The answer's
	// headers come with the first event, which those past acme's share of
	// the runner wait for: the client gives up after a moment.)
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/v1/chat/completions", strings.NewReader(chatBody(2000)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+acme)
		req.Header.Set("Tokenbus-Resumable", "true")
		if res, err := httpClient.Do(req); err == nil {
			res.Body.Close()
		}
		cancel()
	}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 250; i += 10 {
				st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json",
					strings.NewReader(`{"model":"llama-8b","input":"x","max_output_tokens":20,"background":true}`), nil, "Authorization", "Bearer "+acme)
				if st != 200 || err != nil {
					refused.Add(1)
					t.Logf("acme's background %d: %d %v %s", i, st, err, b)
				}
			}
		}()
	}
	wg.Wait()
	if refused.Load() > 0 {
		t.Fatalf("%d of acme's background responses refused", refused.Load())
	}
	// All of it queued or running, in the work queue.
	js, err := jetstream.New(connectNATS(t, d.NATSURL))
	if err != nil {
		t.Fatal(err)
	}
	work, err := js.Stream(context.Background(), responses.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := work.Info(context.Background(), jetstream.WithSubjectFilter(responses.WorkPrefix+">"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("flood queued in %v: %d messages in the work queue", time.Since(floodStart).Round(time.Millisecond), info.State.Msgs)
	if info.State.Msgs < 250 {
		t.Fatalf("the work queue holds %d, want acme's 270 less those done", info.State.Msgs)
	}

	// beta's 3-token background response and resumable stream, at once.
	start := time.Now()
	var r struct{ ID, Status string }
	if st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"llama-8b","input":"x","max_output_tokens":3,"background":true}`), &r, "Authorization", "Bearer "+beta); st != 200 || err != nil {
		t.Fatalf("beta's background: %d %v %s", st, err, b)
	}
	bgDone := make(chan time.Duration, 1)
	go func() {
		for time.Since(start) < time.Minute {
			var got struct{ Status string }
			if st, _, err := httpJSON("GET", d.URL+"/v1/responses/"+r.ID, "", nil, &got, "Authorization", "Bearer "+beta); st == 200 && err == nil && responses.Ended(got.Status) {
				bgDone <- time.Since(start)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		bgDone <- -1
	}()
	ttft := time.Duration(-1)
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/v1/chat/completions", strings.NewReader(chatBody(5)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+beta)
		req.Header.Set("Tokenbus-Resumable", "true")
		sstart := time.Now()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("beta's stream: %v", err)
			return
		}
		defer res.Body.Close()
		s := &sseStream{res: res, sc: bufio.NewScanner(res.Body)}
		if s.next() != "" {
			ttft = time.Since(sstart)
		}
		s.rest()
	}()
	bg := <-bgDone
	t.Logf("with acme's 20 abandoned streams and 250 background responses queued: beta's first token %v, beta's background response done in %v",
		ttft.Round(time.Millisecond), bg.Round(time.Millisecond))
	if ttft < 0 || bg < 0 || ttft > 3*time.Second || bg > 5*time.Second {
		t.Fatalf("beta waited behind acme: first token %v (bound 3s), background %v (bound 5s)", ttft, bg)
	}
}

// TestResumableDeadlineAndCancel (finding 6): a resumable stream ends with
// a timeout error event at --request-timeout; POST
// /v1/chat/completions/{id}/cancel ends a running one (its tenant's only),
// and its followers see stream_cancelled.
func TestResumableDeadlineAndCancel(t *testing.T) {
	t.Parallel()
	d, _, acme, beta := sharedDev(t, func(c *program.DevConfig) { c.HTTP.RequestTimeout = 2 * time.Second })
	s, st, err := resumable(t, d.URL, acme, 2000) // 40 s of tokens
	if err != nil {
		t.Fatalf("%d %v", st, err)
	}
	ev := s.rest()
	s.close()
	if len(ev) < 2 || !strings.Contains(ev[len(ev)-1], `"code":"timeout"`) || time.Since(s.start) > 10*time.Second {
		t.Fatalf("past --request-timeout (2s), after %v: last event %q", time.Since(s.start), ev[max(0, len(ev)-1):])
	}

	d2, _, acme2, beta2 := sharedDev(t)
	s, st, err = resumable(t, d2.URL, acme2, 2000)
	if err != nil {
		t.Fatalf("%d %v", st, err)
	}
	defer s.close()
	sid := s.res.Header.Get("Tokenbus-Stream-Id")
	for range 5 {
		s.next()
	}
	cancel := func(key string) (int, []byte) {
		st, b, err := httpJSON("POST", d2.URL+"/v1/chat/completions/"+sid+"/cancel", "", nil, nil, "Authorization", "Bearer "+key)
		if err != nil {
			t.Fatal(err)
		}
		return st, b
	}
	if st, b := cancel(beta2); st != 404 {
		t.Fatalf("cancel by another tenant: %d %s, want 404", st, b)
	}
	if st, b := cancel(acme2); st != 200 || !strings.Contains(string(b), `"status":"cancelled"`) {
		t.Fatalf("cancel: %d %s", st, b)
	}
	rest := s.rest()
	if len(rest) == 0 || !strings.Contains(rest[len(rest)-1], "stream_cancelled") || time.Since(s.start) > 10*time.Second {
		t.Fatalf("after the cancel the stream ended with %q after %v", rest[max(0, len(rest)-1):], time.Since(s.start))
	}
	if st, b := cancel(acme2); st != 200 {
		t.Errorf("a second cancel: %d %s, want 200 (cancelled)", st, b)
	}
	_ = beta
}

// TestResponsesQuota (finding 6): per-tenant quotas on queued or running
// background responses and resumable streams and on stored responses are
// 429 quota_exceeded before anything is written; another tenant is not
// affected, and a delete makes room.
func TestResponsesQuota(t *testing.T) {
	t.Parallel()
	d, _, acme, beta := sharedDev(t, func(c *program.DevConfig) {
		c.HTTP.Responses.Quota = responses.Quota{Stored: 4, Background: 2, Resumable: 1}
	})
	auth := func(key string) []string { return []string{"Authorization", "Bearer " + key} }
	post := func(key, body string) (int, []byte) {
		var r struct{ ID string }
		st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json", strings.NewReader(body), &r, auth(key)...)
		if err != nil {
			t.Fatal(err)
		}
		return st, b
	}
	isQuota := func(st int, b []byte) bool {
		return st == 429 && strings.Contains(string(b), `"code":"quota_exceeded"`)
	}
	long := `{"model":"llama-8b","input":"x","max_output_tokens":2000,"background":true}`
	for i := range 2 {
		if st, b := post(acme, long); st != 200 {
			t.Fatalf("background %d: %d %s", i, st, b)
		}
	}
	if st, b := post(acme, long); !isQuota(st, b) {
		t.Fatalf("a third background response: %d %s, want 429 quota_exceeded", st, b)
	}
	if st, b := post(beta, long); st != 200 {
		t.Fatalf("beta's background: %d %s", st, b)
	}
	s, st, err := resumable(t, d.URL, acme, 2000)
	if err != nil {
		t.Fatalf("acme's resumable: %d %v", st, err)
	}
	defer s.close()
	if _, st, err := resumable(t, d.URL, acme, 5); st != 429 || !strings.Contains(err.Error(), "quota_exceeded") {
		t.Fatalf("a second resumable stream: %d %v, want 429 quota_exceeded", st, err)
	}
	// Stored: acme has 3 (2 background, 1 stream); one more, then 429.
	var r struct{ ID string }
	if st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"llama-8b","input":"x","max_output_tokens":2}`), &r, auth(acme)...); st != 200 || err != nil {
		t.Fatalf("a stored response: %d %v %s", st, err, b)
	}
	if st, b := post(acme, `{"model":"llama-8b","input":"x","max_output_tokens":2}`); !isQuota(st, b) {
		t.Fatalf("a fifth stored: %d %s, want 429 quota_exceeded", st, b)
	}
	if st, b := post(acme, `{"model":"llama-8b","input":"x","max_output_tokens":2,"store":false}`); st != 200 {
		t.Fatalf("store:false is not stored: %d %s", st, b)
	}
	if st, b, _ := httpJSON("DELETE", d.URL+"/v1/responses/"+r.ID, "", nil, nil, auth(acme)...); st != 200 {
		t.Fatalf("delete: %d %s", st, b)
	}
	if st, b := post(acme, `{"model":"llama-8b","input":"x","max_output_tokens":2}`); st != 200 {
		t.Fatalf("after a delete: %d %s", st, b)
	}
}

// TestResponsesKeyRevoked (finding 8, the responses side): a key deleted
// in the registry (a real redis-server) ends its queued and running
// background responses and resumable streams, in band, naming the key.
func TestResponsesKeyRevoked(t *testing.T) {
	t.Parallel()
	// The gateway's own wiring: registry.Revocations, told of the deletion
	// by the admin API's keys event.
	d, _, acme, beta := sharedDev(t, func(c *program.DevConfig) {
		c.HTTP.Responses.RunnerSlots, c.HTTP.Responses.RunnerTenantSlots = 2, 2
	})
	var key struct{ ID, Key string }
	if st := adminCall(t, d, limitsAdminToken, "POST", "/keys", `{"name":"doomed","tenant":"acme"}`, &key); st != 201 {
		t.Fatalf("POST /keys: %d", st)
	}
	// Running: a resumable stream (holding one of the 2 slots) and a
	// background one (the other); queued: one more background response.
	s, st, err := resumable(t, d.URL, key.Key, 2000)
	if err != nil {
		t.Fatalf("%d %v", st, err)
	}
	defer s.close()
	s.next()
	var bg [2]struct{ ID string }
	for i := range bg {
		if st, b, err := httpJSON("POST", d.URL+"/v1/responses", "application/json",
			strings.NewReader(`{"model":"llama-8b","input":"x","max_output_tokens":2000,"background":true}`), &bg[i], "Authorization", "Bearer "+key.Key); st != 200 || err != nil {
			t.Fatalf("background %d: %d %v %s", i, st, err, b)
		}
	}
	if st := adminCall(t, d, limitsAdminToken, "DELETE", "/keys/"+key.ID, "", nil); st != 200 {
		t.Fatalf("DELETE /keys: %d", st)
	}
	deleted := time.Now()
	rest := s.rest()
	if len(rest) == 0 || !strings.Contains(rest[len(rest)-1], "api_key_revoked") || !strings.Contains(rest[len(rest)-1], key.ID) {
		t.Fatalf("the running stream ended with %q", rest[max(0, len(rest)-1):])
	}
	t.Logf("the running stream ended %v after the key's deletion", time.Since(deleted).Round(time.Millisecond))
	// The responses, read with another key of the tenant: failed, naming
	// the key; the queued one without a token generated.
	for i, r := range bg {
		testenv.WaitFor(t, 10*time.Second, func() error {
			var got struct {
				Status string
				Error  *struct{ Code, Message string }
				Usage  *struct {
					OutputTokens int `json:"output_tokens"`
				}
			}
			st, b, err := httpJSON("GET", d.URL+"/v1/responses/"+r.ID, "", nil, &got, "Authorization", "Bearer "+acme)
			if st != 200 || err != nil {
				return fmt.Errorf("%d %v %s", st, err, b)
			}
			if got.Status != "failed" || got.Error == nil || got.Error.Code != "api_key_revoked" || !strings.Contains(got.Error.Message, key.ID) {
				return fmt.Errorf("background %d: %s", i, b)
			}
			if i == 1 && (got.Usage == nil || got.Usage.OutputTokens != 0) {
				return fmt.Errorf("the queued one generated: %s", b)
			}
			return nil
		})
	}
	// Other keys' work runs on.
	s2, st, err := resumable(t, d.URL, beta, 3)
	if err != nil {
		t.Fatalf("beta: %d %v", st, err)
	}
	if ev := s2.rest(); len(ev) == 0 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("beta's stream: %v", ev)
	}
	s2.close()
}

// TestBatchFinalizeLeavesNoConsumer (finding 2, the batch side): a batch's
// finalisation reads its results with an ordered consumer, deleted when it
// is done; before, it stayed 5 minutes against the results stream's
// consumer limit, which every tenant's batches share.
func TestBatchFinalizeLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	d := startDev(t, func(c *program.DevConfig) {
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = time.Millisecond, time.Millisecond
	})
	js, err := jetstream.New(connectNATS(t, d.NATSURL))
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	for i := range 3 {
		fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"llama-8b","max_tokens":2,"messages":[{"role":"user","content":"x"}]}}`+"\n", i)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(in.Bytes())
	_ = mw.Close()
	var file struct{ ID string }
	if st, b, err := httpJSON("POST", d.URL+"/v1/files", mw.FormDataContentType(), &body, &file); st != 200 || err != nil {
		t.Fatalf("upload: %d %v %s", st, err, b)
	}
	var b batchState
	if st, raw, err := httpJSON("POST", d.URL+"/v1/batches", "application/json", strings.NewReader(
		`{"input_file_id":"`+file.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`), &b); st != 200 || err != nil {
		t.Fatalf("create: %d %v %s", st, err, raw)
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		if st, raw, err := httpJSON("GET", d.URL+"/v1/batches/"+b.ID, "", nil, &b); st != 200 || err != nil {
			return fmt.Errorf("%d %v %s", st, err, raw)
		}
		if b.Status != "completed" {
			return errors.New(b.Status)
		}
		return nil
	})
	s, err := js.Stream(context.Background(), "TOKENBUS_BATCH_RESULTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on TOKENBUS_BATCH_RESULTS after the batch completed", info.State.Consumers)
	}
}
