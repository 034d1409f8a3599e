package admin

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// registry is the gateway's series the traffic events read, by name.
type series struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	tokens   *prometheus.CounterVec
	chunks   *prometheus.CounterVec
	sErrors  *prometheus.CounterVec
	ttft     *prometheus.HistogramVec
	itl      *prometheus.HistogramVec
}

func newSeries() *series {
	s := &series{reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokenbus_gateway_requests_total"}, []string{"route", "model", "status"}),
		tokens:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokenbus_gateway_tokens_total"}, []string{"model", "type"}),
		chunks:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokenbus_gateway_output_chunks_total"}, []string{"model"}),
		sErrors:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokenbus_gateway_stream_errors_total"}, []string{"model", "code"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokenbus_gateway_time_to_first_token_seconds",
			Buckets: []float64{.01, .02, .05, .1}}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokenbus_gateway_inter_token_latency_seconds",
			Buckets: []float64{.001, .01, .1}}, []string{"model"}),
	}
	s.reg.MustRegister(s.requests, s.tokens, s.chunks, s.sErrors, s.ttft, s.itl)
	return s
}

func (s *series) snap(t *testing.T, at time.Time) snapshot {
	t.Helper()
	f, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return read(f, at)
}

func approx(p *float64, want float64) bool { return p != nil && math.Abs(*p-want) < 1e-6 }

// An event is the difference of two reads: rates over the interval, the
// interval's quantiles (across models), errors by status and stream code.
func TestTrafficEvent(t *testing.T) {
	s := newSeries()
	t0 := time.Unix(1000, 0)
	// Before the interval: must not count in it.
	s.requests.WithLabelValues("/v1/chat/completions", "a", "200").Add(50)
	s.requests.WithLabelValues("/v1/chat/completions", "a", "429").Add(3)
	s.ttft.WithLabelValues("a").Observe(.09)
	s.tokens.WithLabelValues("a", "completion").Add(1000)
	prev := s.snap(t, t0)

	s.requests.WithLabelValues("/v1/chat/completions", "a", "200").Add(8)
	s.requests.WithLabelValues("/v1/completions", "b", "200").Add(2)
	s.requests.WithLabelValues("/v1/chat/completions", "a", "429").Add(2)
	s.requests.WithLabelValues("/v1/chat/completions", "a", "503").Add(1)
	s.sErrors.WithLabelValues("a", "timeout").Add(1)
	s.tokens.WithLabelValues("a", "completion").Add(300)
	s.tokens.WithLabelValues("b", "completion").Add(100)
	s.tokens.WithLabelValues("a", "prompt").Add(999) // not output
	s.chunks.WithLabelValues("a").Add(420)
	// 10 first tokens over two models: 5 in (0, .01], 4 in (.01, .02], 1 in (.05, .1].
	for range 5 {
		s.ttft.WithLabelValues("a").Observe(.005)
	}
	for range 4 {
		s.ttft.WithLabelValues("b").Observe(.015)
	}
	s.ttft.WithLabelValues("b").Observe(.07)
	e := event(prev, s.snap(t, t0.Add(2*time.Second)))

	if e.RequestsPS != 6.5 || e.TokensPerS != 200 || e.ChunksPerS != 210 {
		t.Errorf("rates: requests %v tokens %v chunks %v; want 6.5 (13 in 2 s), 200 (400 completion tokens), 210", e.RequestsPS, e.TokensPerS, e.ChunksPerS)
	}
	// p50: rank 5 of 10, the top of the first bucket (10 ms); p99: rank 9.9
	// in (.05, .1], 90% of the way: 95 ms.
	if !approx(e.TTFTP50, 10) || !approx(e.TTFTP99, 95) {
		t.Errorf("ttft p50 %v p99 %v; want 10, 95", deref(e.TTFTP50), deref(e.TTFTP99))
	}
	if e.ITLP50 != nil || e.ITLP99 != nil {
		t.Errorf("itl %v %v with no observations; want null", deref(e.ITLP50), deref(e.ITLP99))
	}
	if got := errorCodes(e); !slices.Equal(got, []string{"429", "503", "stream:timeout"}) || e.Errors["429"] != 2 {
		t.Errorf("errors %v; want 429: 2, 503: 1, stream:timeout: 1", e.Errors)
	}

	// Nothing new: zeros and nulls, no errors.
	cur := s.snap(t, t0.Add(2*time.Second))
	e = event(cur, s.snap(t, t0.Add(3*time.Second)))
	if e.RequestsPS != 0 || e.TTFTP50 != nil || len(e.Errors) != 0 {
		t.Errorf("an idle second: %+v", e)
	}
	// A counter that went down (a restart) is no negative rate.
	if e := event(cur, snapshot{at: t0.Add(4 * time.Second)}); e.RequestsPS != 0 || e.TokensPerS != 0 {
		t.Errorf("after a reset: %+v", e)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// Quantiles past the last bucket are its bound, as Prometheus answers.
func TestQuantileOverflow(t *testing.T) {
	s := newSeries()
	prev := s.snap(t, time.Unix(0, 0))
	s.itl.WithLabelValues("a").Observe(5)
	e := event(prev, s.snap(t, time.Unix(1, 0)))
	if !approx(e.ITLP50, 100) {
		t.Fatalf("itl p50 %v; want 100 (the last bound, .1 s)", deref(e.ITLP50))
	}
}

// The queue by flow comes from the dispatcher's gauge: tenants with requests
// queued, most first; empty lines left out.
func TestTrafficFlows(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokenbus_dispatcher_flow_queued"}, []string{"model", "band", "tenant"})
	reg.MustRegister(g)
	g.WithLabelValues("m", "interactive", "flood").Set(60)
	g.WithLabelValues("m", "interactive", "quiet").Set(1)
	g.WithLabelValues("m", "batch", "nightly").Set(12)
	g.WithLabelValues("m", "critical", "gone").Set(0)
	f, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1000, 0)
	e := event(read(nil, at.Add(-time.Second)), read(f, at))
	want := []flowQueued{{"m", "interactive", "flood", 60}, {"m", "batch", "nightly", 12}, {"m", "interactive", "quiet", 1}}
	if !slices.Equal(e.Flows, want) {
		t.Errorf("flows %+v, want %+v", e.Flows, want)
	}
}
