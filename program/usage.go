package program

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/usage"
)

// startUsage starts the gateway's usage publisher (records of finished
// requests into JetStream, written straight to Redis when JetStream refuses
// them) and the consumer that writes the stream's records to Redis. Both
// run until stopUsageAfter, after the last request's usage was published.
func (gw *gatewayRun) startUsage(limiter *registry.Limiter, reg prometheus.Registerer) error {
	lim := gw.cfg.HTTP.Limits
	record := func(ctx context.Context, recs []schemas.UsageRecord) error {
		_, err := limiter.RecordBatch(ctx, recs)
		return err
	}
	pub, err := usage.NewPublisher(gw.nc, usage.PublisherConfig{Source: "gateway", MaxBuffered: lim.UsageBuffer,
		Fallback: record, Log: gw.log, Metrics: reg})
	if err != nil {
		return err
	}
	gw.pub = pub
	ctx, stop := context.WithCancel(context.Background())
	gw.stopUsage, gw.usageDone = stop, make(chan struct{})
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		usage.Consume(ctx, gw.nc, limiter, usage.ConsumerConfig{Stream: lim.UsageStream, Log: gw.log, Metrics: reg})
	}()
	go func() {
		defer close(gw.usageDone)
		pub.Run(ctx)
		<-consumed
	}()
	return nil
}

// stopUsageAfter lets the publisher store what it holds until ctx ends,
// then stops it and the consumer (records left in the stream wait there for
// the next gateway).
func (gw *gatewayRun) stopUsageAfter(ctx context.Context) {
	if gw.pub == nil {
		return
	}
	if err := gw.pub.Flush(ctx); err != nil {
		gw.log.Warn("usage records still unpublished at shutdown", "records", gw.pub.Pending())
	}
	gw.stopUsage()
	<-gw.usageDone
}

// newBreaker is the store's circuit breaker, with its state as a gauge and
// its transitions counted and logged.
func newBreaker(cfg registry.BreakerConfig, reg prometheus.Registerer, log *slog.Logger) *registry.Breaker {
	transitions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenbus_redis_breaker_transitions_total",
		Help: "Transitions of the Redis circuit breaker, by the state entered.",
	}, []string{"to"})
	for _, st := range []registry.BreakerState{registry.BreakerClosed, registry.BreakerHalfOpen, registry.BreakerOpen} {
		transitions.WithLabelValues(st.String()) // each from start-up, at 0
	}
	cfg.OnChange = func(from, to registry.BreakerState) {
		transitions.WithLabelValues(to.String()).Inc()
		log.Warn("Redis circuit breaker", "from", from.String(), "to", to.String())
	}
	br := registry.NewBreaker(cfg)
	if reg != nil {
		reg.MustRegister(transitions, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tokenbus_redis_breaker_state",
			Help: "The Redis circuit breaker: 0 closed (calls go to Redis), 1 half-open (one probe), 2 open (calls fail at once).",
		}, func() float64 { return float64(br.State()) }))
	}
	return br
}
