package admin

import (
	"bufio"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenbus/tokenbus/schemas"
)

// maxTrafficStreams bounds the open GET /events/traffic streams: each reads
// the whole metrics registry once a second.
const maxTrafficStreams = 16

// trafficInterval is the time between traffic events.
const trafficInterval = time.Second

// trafficEvent is one GET /events/traffic event: the last interval's rates
// and latencies. Quantiles are null when no request had its first token (or
// a token gap) in the interval.
type trafficEvent struct {
	Time       int64            `json:"time"` // unix milliseconds
	TokensPerS float64          `json:"tokens_per_s"`
	ChunksPerS float64          `json:"chunks_per_s"`
	RequestsPS float64          `json:"requests_per_s"`
	TTFTP50    *float64         `json:"ttft_p50_ms"`
	TTFTP99    *float64         `json:"ttft_p99_ms"`
	ITLP50     *float64         `json:"itl_p50_ms"`
	ITLP99     *float64         `json:"itl_p99_ms"`
	Running    int              `json:"running"`
	Waiting    int              `json:"waiting"` // the queue: requests the workers hold but do not run yet
	Streams    float64          `json:"active_streams"`
	Errors     map[string]int64 `json:"errors"` // by HTTP status ("429") and stream error code ("stream:timeout")
	Workers    int              `json:"workers"`
	// Flows is the dispatcher's queue by flow (docs/scheduling.md), from
	// tokenbus_dispatcher_flow_queued: the tenants with requests queued, by
	// model and band, most first.
	Flows []flowQueued `json:"flows"`
}

// flowQueued is one line of the queue by flow.
type flowQueued struct {
	Model  string `json:"model"`
	Band   string `json:"band"`
	Tenant string `json:"tenant"`
	Queued int    `json:"queued"`
}

// snapshot is what one read of the registry gives: counters summed over
// their labels, histograms merged over models.
type snapshot struct {
	at        time.Time
	tokens    float64 // completion tokens
	chunks    float64
	requests  float64
	errors    map[string]float64
	ttft, itl hist
	streams   float64
	flows     []flowQueued
}

// hist is a cumulative histogram: upper bounds and counts.
type hist struct {
	bounds []float64
	counts []float64
	total  float64
}

func (h *hist) add(m *dto.Histogram) {
	if h.bounds == nil {
		for _, b := range m.GetBucket() {
			h.bounds = append(h.bounds, b.GetUpperBound())
		}
		h.counts = make([]float64, len(h.bounds))
	}
	for i, b := range m.GetBucket() {
		if i < len(h.counts) && b.GetUpperBound() == h.bounds[i] {
			h.counts[i] += float64(b.GetCumulativeCount())
		}
	}
	h.total += float64(m.GetSampleCount())
}

// quantile of the observations between prev and h, in milliseconds, as
// Prometheus's histogram_quantile estimates it (linear within a bucket); nil
// when there were none.
func (h hist) quantile(prev hist, q float64) *float64 {
	n := h.total - prev.total
	if n <= 0 || len(h.bounds) == 0 {
		return nil
	}
	delta := func(i int) float64 {
		if i < len(prev.counts) {
			return h.counts[i] - prev.counts[i]
		}
		return h.counts[i]
	}
	rank := q * n
	lower, below := 0.0, 0.0
	for i, ub := range h.bounds {
		c := delta(i)
		if c >= rank {
			v := ub
			if c > below {
				v = lower + (ub-lower)*(rank-below)/(c-below)
			}
			v *= 1000
			return &v
		}
		lower, below = ub, c
	}
	v := h.bounds[len(h.bounds)-1] * 1000 // past the last bound: its value, as Prometheus answers
	return &v
}

// read takes a snapshot of families.
func read(families []*dto.MetricFamily, at time.Time) snapshot {
	s := snapshot{at: at, errors: map[string]float64{}}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "tokenbus_gateway_tokens_total":
				if label(m, "type") == "completion" {
					s.tokens += m.GetCounter().GetValue()
				}
			case "tokenbus_gateway_output_chunks_total":
				s.chunks += m.GetCounter().GetValue()
			case "tokenbus_gateway_requests_total":
				s.requests += m.GetCounter().GetValue()
				if st := label(m, "status"); len(st) == 3 && st >= "400" {
					s.errors[st] += m.GetCounter().GetValue()
				}
			case "tokenbus_gateway_stream_errors_total":
				s.errors["stream:"+label(m, "code")] += m.GetCounter().GetValue()
			case "tokenbus_gateway_time_to_first_token_seconds":
				s.ttft.add(m.GetHistogram())
			case "tokenbus_gateway_inter_token_latency_seconds":
				s.itl.add(m.GetHistogram())
			case "tokenbus_gateway_active_streams":
				s.streams += m.GetGauge().GetValue()
			case "tokenbus_dispatcher_flow_queued":
				if n := int(m.GetGauge().GetValue()); n > 0 {
					s.flows = append(s.flows, flowQueued{Model: label(m, "model"), Band: label(m, "band"), Tenant: label(m, "tenant"), Queued: n})
				}
			}
		}
	}
	return s
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// event is the traffic between prev and cur.
func event(prev, cur snapshot) trafficEvent {
	dt := cur.at.Sub(prev.at).Seconds()
	rate := func(a, b float64) float64 {
		if dt <= 0 || b < a { // a counter reset (a restart) is no negative rate
			return 0
		}
		return math.Round((b-a)/dt*100) / 100
	}
	e := trafficEvent{Time: cur.at.UnixMilli(), TokensPerS: rate(prev.tokens, cur.tokens), ChunksPerS: rate(prev.chunks, cur.chunks),
		RequestsPS: rate(prev.requests, cur.requests), Streams: cur.streams, Errors: map[string]int64{},
		TTFTP50: cur.ttft.quantile(prev.ttft, .5), TTFTP99: cur.ttft.quantile(prev.ttft, .99),
		ITLP50: cur.itl.quantile(prev.itl, .5), ITLP99: cur.itl.quantile(prev.itl, .99), Flows: cur.flows}
	if e.Flows == nil {
		e.Flows = []flowQueued{}
	}
	sort.Slice(e.Flows, func(i, j int) bool {
		a, b := e.Flows[i], e.Flows[j]
		if a.Queued != b.Queued {
			return a.Queued > b.Queued
		}
		return a.Model+a.Band+a.Tenant < b.Model+b.Band+b.Tenant
	})
	for code, n := range cur.errors {
		if d := n - prev.errors[code]; d > 0 {
			e.Errors[code] = int64(d)
		}
	}
	return e
}

// GET /events/traffic: Server-Sent Events, one trafficEvent a second, read
// from the process's metrics registry (what /metrics shows) and the live
// worker table, until the client goes or the server shuts down. 429 past
// maxTrafficStreams open streams; 503 without a registry.
func (s *Server) traffic(c *fiber.Ctx) error {
	if s.cfg.Metrics == nil {
		return schemas.ErrInternal.New("this admin API has no metrics registry")
	}
	select {
	case s.streams <- struct{}{}:
	default:
		return schemas.ErrTooManyTrafficStreams.New(maxTrafficStreams)
	}
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no")
	base, gather, fleetView := s.base, s.cfg.Metrics, s.cfg.Fleet
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer func() { <-s.streams }()
		snap := func() snapshot {
			fams, _ := gather.Gather() // a failing collector leaves the others
			return read(fams, time.Now())
		}
		prev := snap()
		tick := time.NewTicker(trafficInterval)
		defer tick.Stop()
		// A first comment at once, so that the client sees the stream open.
		if _, err := w.WriteString(": traffic every " + strconv.Itoa(int(trafficInterval/time.Millisecond)) + "ms\n\n"); err != nil || w.Flush() != nil {
			return
		}
		for {
			select {
			case <-base.Done():
				return
			case <-tick.C:
			}
			cur := snap()
			e := event(prev, cur)
			prev = cur
			ws := fleetView.Workers()
			e.Workers = len(ws)
			for _, wk := range ws {
				e.Running += wk.Running
				e.Waiting += wk.Waiting
			}
			b, _ := json.Marshal(e)
			if _, err := w.WriteString("data: "); err != nil {
				return
			}
			_, _ = w.Write(b)
			_, _ = w.WriteString("\n\n")
			if w.Flush() != nil { // the client went away
				return
			}
		}
	})
	return nil
}

// errorCodes are the keys of trafficEvent.Errors, sorted, for tests and logs.
func errorCodes(e trafficEvent) []string {
	out := make([]string, 0, len(e.Errors))
	for k := range e.Errors {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
