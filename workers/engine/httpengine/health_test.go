package httpengine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// queueing is a server that answers GET /health only when no generation
// runs (it queues behind them, as a one-request-at-a-time server does) and
// streams a chunk every 5ms until release is closed.
type queueing struct {
	running atomic.Int32
	probes  atomic.Int32
	release chan struct{}
}

func (q *queueing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		q.probes.Add(1)
		for q.running.Load() > 0 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
		w.WriteHeader(http.StatusOK)
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"base","object":"model"}]}`)
	case "/v1/chat/completions":
		q.running.Add(1)
		defer q.running.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-q.release:
				fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
				return
			case <-tick.C:
				fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n")
				w.(http.Flusher).Flush()
			}
		}
	default:
		http.NotFound(w, r)
	}
}

// A busy server whose health path waits behind generation stays healthy
// while it streams: the stream proves it alive, it is not probed meanwhile,
// and the request in flight is neither ended nor disturbed.
func TestBusyServerStaysHealthy(t *testing.T) {
	q := &queueing{release: make(chan struct{})}
	srv := httptest.NewServer(q)
	t.Cleanup(srv.Close)
	cfg := fastConfig(srv.URL)
	cfg.HealthPath = "/health"
	cfg.HealthTimeout = 50 * time.Millisecond
	e := newEngine(t, cfg)
	healthy(t, e)

	// The verdict is read at every chunk: 80 chunks of 5ms span 40 health
	// periods of 10ms, each a probe timing out after 50ms if one were sent.
	var sick atomic.Pointer[error]
	sink := &recSink{OnCall: func(int) error {
		if err := e.Health(t.Context()); err != nil {
			sick.CompareAndSwap(nil, &err)
		}
		return nil
	}}
	errc := make(chan error, 1)
	go func() {
		_, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true}`), sink)
		errc <- err
	}()
	// Counted from the stream's first chunk: a probe sent while the engine
	// was still idle, before Generate began, is not one sent during it.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if len(sink.Lines()) == 0 {
			return errors.New("no chunk yet")
		}
		return nil
	})
	probes := q.probes.Load()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if n := len(sink.Lines()); n < 80 {
			return fmt.Errorf("%d chunks", n)
		}
		return nil
	})
	if err := sick.Load(); err != nil {
		t.Errorf("a busy server was judged unhealthy: %v", *err)
	}
	if n := q.probes.Load() - probes; n != 0 {
		t.Errorf("%d probes sent while a stream ran", n)
	}
	close(q.release)
	if err := <-errc; err != nil {
		t.Fatalf("the stream failed: %v", err)
	}
	// Idle again: probes resume.
	testenv.WaitFor(t, 5*time.Second, func() error {
		if q.probes.Load() == probes {
			return errors.New("no probe after the stream")
		}
		return nil
	})
	healthy(t, e)
}

// A probe sent while idle that a request overtakes (the probe waits behind
// it and times out) does not count: the request is being answered.
func TestProbeOvertakenByRequest(t *testing.T) {
	q := &queueing{release: make(chan struct{})}
	var armed atomic.Bool
	overtake := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && armed.CompareAndSwap(true, false) {
			overtake <- struct{}{} // a request arrives now, just behind the probe
			testenv.WaitFor(t, 5*time.Second, func() error {
				if q.running.Load() == 0 {
					return errors.New("not streaming yet")
				}
				return nil
			})
		}
		q.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := fastConfig(srv.URL)
	cfg.HealthPath = "/health"
	cfg.HealthTimeout = 100 * time.Millisecond
	cfg.HealthInterval = time.Hour // one verdict at the start; the test calls judge itself
	cfg.Models = []string{"base"}  // no model refresh: nothing but the test's request is served
	e := newEngine(t, cfg)
	healthy(t, e)

	armed.Store(true)
	errc := make(chan error, 1)
	go func() {
		<-overtake
		_, err := e.Generate(t.Context(), chat(`{"model":"base","stream":true}`), &recSink{})
		errc <- err
	}()
	e.judge()
	if q.probes.Load() < 2 {
		t.Fatal("judge did not probe: the test proves nothing")
	}
	if err := e.Health(t.Context()); err != nil {
		t.Errorf("judged unhealthy while answering: %v", err)
	}
	close(q.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// A server that has no health path (404) fails WaitReady at once, with a
// message that names the path, instead of waiting for StartTimeout.
func TestMissingHealthPathFailsFast(t *testing.T) {
	_, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.HealthPath = "/nope"
	e := newEngine(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err := e.WaitReady(ctx)
	if err == nil {
		t.Fatal("ready without a health path")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
	if !strings.Contains(err.Error(), "/nope") || !strings.Contains(err.Error(), "404") {
		t.Errorf("message: %v", err)
	}
}

// With probing off the server is never probed: healthy while it serves.
func TestProbingOff(t *testing.T) {
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			probes.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"object":"list","data":[{"id":"base"}]}`)
	}))
	t.Cleanup(srv.Close)
	cfg := fastConfig(srv.URL)
	cfg.HealthPath = "/health"
	cfg.HealthInterval = -1
	e := newEngine(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if n := probes.Load(); n != 0 {
		t.Errorf("%d probes with probing off", n)
	}
}
