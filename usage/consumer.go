package usage

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
)

// Recorder writes records where usage is counted; registry.Limiter is the
// one. dups counts records it had already counted. It must be idempotent by
// request id: a record may be delivered more than once (a message whose ack
// was lost, a request run again), and a batch that failed is sent again
// whole.
type Recorder interface {
	RecordBatch(ctx context.Context, recs []schemas.UsageRecord) (dups int, err error)
}

// ConsumerConfig configures Consume. Zero values take the defaults shown.
type ConsumerConfig struct {
	Stream StreamConfig
	Batch  int           // records fetched at a time; default 64
	Retry  time.Duration // wait after Redis refused a record; default 1s
	// Timeout bounds one Record call (the store's breaker bounds it more
	// tightly). Default 2s.
	Timeout time.Duration
	Log     *slog.Logger
	Metrics prometheus.Registerer // may be nil
}

// Consume writes the stream's records with rec until ctx ends: it makes
// the stream and the durable consumer if they are missing, fetches records
// and acks each only after rec took it. While rec fails (Redis down) the
// records stay in the stream and are tried again every Retry. It returns
// when ctx ends; JetStream errors are logged and retried, never returned.
func Consume(ctx context.Context, nc *nats.Conn, rec Recorder, cfg ConsumerConfig) {
	if cfg.Batch <= 0 {
		cfg.Batch = 64
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := newConsumerMetrics(cfg.Metrics)
	c := &consumer{cfg: cfg, rec: rec, log: log, m: m}
	for ctx.Err() == nil {
		cons, err := c.setUp(ctx, nc)
		if err == nil {
			err = c.run(ctx, cons)
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("usage consumer: JetStream unavailable; retrying", "err", err)
		if !sleep(ctx, cfg.Retry) {
			return
		}
	}
}

type consumer struct {
	cfg ConsumerConfig
	rec Recorder
	log *slog.Logger
	m   consumerMetrics
	// warned is when a failed write was last logged: one line per
	// refusedLogEvery while Redis refuses, not one per message.
	warned time.Time
}

// refusedLogEvery spaces the log lines of records Redis did not take.
const refusedLogEvery = 10 * time.Second

type consumerMetrics struct {
	recorded, duplicates, retried, bad prometheus.Counter
}

func newConsumerMetrics(reg prometheus.Registerer) consumerMetrics {
	m := consumerMetrics{
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_recorded_total",
			Help: "Usage records from the stream written to Redis and acknowledged.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_duplicates_total",
			Help: "Usage records delivered again after they had been counted (acknowledged, not counted twice).",
		}),
		retried: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_record_retries_total",
			Help: "Usage records Redis could not take, left in the stream to be tried again.",
		}),
		bad: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_malformed_total",
			Help: "Messages on the usage subjects that are no usage record (removed from the stream and logged).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.recorded, m.duplicates, m.retried, m.bad)
	}
	return m
}

func (c *consumer) setUp(ctx context.Context, nc *nats.Conn) (jetstream.Consumer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := EnsureStream(sctx, js, c.cfg.Stream)
	if err != nil {
		return nil, err
	}
	return s.CreateOrUpdateConsumer(sctx, jetstream.ConsumerConfig{
		Durable:       Consumer,
		Description:   "writes usage records to Redis; shared by every gateway",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1, // a record is never given up on: Redis comes back
		MaxAckPending: 4 * c.cfg.Batch * 16,
	})
}

// run pulls and records until ctx ends (nil) or JetStream fails.
func (c *consumer) run(ctx context.Context, cons jetstream.Consumer) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(c.cfg.Batch))
	if err != nil {
		return err
	}
	defer it.Stop()
	// Stop ends a Next that waits for messages, so closing is immediate.
	defer context.AfterFunc(ctx, it.Stop)()
	for {
		msg, err := it.Next()
		if ctx.Err() != nil {
			if err == nil {
				_ = msg.Nak() // not ours to record any more: the next consumer takes it now
			}
			return nil
		}
		if err != nil {
			return err
		}
		// Redis refused it: wait before the next, which would most likely
		// fail too (the prefetched ones are tried one per Retry).
		if !c.handle(ctx, msg) && !sleep(ctx, c.cfg.Retry) {
			return nil
		}
	}
}

// handle records one message (the records of one or more requests); false
// when Redis did not take them.
func (c *consumer) handle(ctx context.Context, msg jetstream.Msg) bool {
	recs, bad := DecodeRecords(msg.Data())
	if len(bad) > 0 {
		c.m.bad.Add(float64(len(bad)))
		c.log.Error("usage consumer: lines that are no usage record; removed", "subject", msg.Subject(),
			"lines", len(bad), "err", bad[0])
	}
	if len(recs) == 0 {
		_ = msg.Term()
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	dups, err := c.rec.RecordBatch(rctx, recs)
	cancel()
	if err != nil {
		c.m.retried.Add(float64(len(recs)))
		_ = msg.NakWithDelay(c.cfg.Retry)
		if time.Since(c.warned) >= refusedLogEvery {
			c.warned = time.Now()
			c.log.Warn("usage consumer: Redis did not take usage records; they stay in the stream and are tried again",
				"records", len(recs), "err", err)
		}
		return false
	}
	c.m.duplicates.Add(float64(dups))
	c.m.recorded.Add(float64(len(recs) - dups))
	_ = msg.Ack()
	return true
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
