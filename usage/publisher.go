package usage

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
)

// PublisherConfig configures a Publisher. Zero values take the defaults shown.
type PublisherConfig struct {
	// Source is the subject's last token (schemas.UsagePrefix + Source),
	// e.g. "gateway" or "worker". Default "gateway".
	Source string
	// MaxBuffered bounds the records waiting to be published; past it a
	// record is dropped (counted, logged). Default 100000 (about 30 MB).
	MaxBuffered int
	// Workers publish in parallel, each waiting for its acks. Default 4.
	Workers int
	// Timeout bounds one publish and its ack. Default 2s.
	Timeout time.Duration
	// Retry is the wait before trying a refused record again. Default 250ms.
	Retry time.Duration
	// Fallback, if set, is tried when JetStream refuses a record: e.g. a
	// gateway's registry.Limiter.Record, writing it straight to Redis. A
	// record it took is done.
	Fallback func(context.Context, schemas.UsageRecord) error
	Log      *slog.Logger
	Metrics  prometheus.Registerer // may be nil
}

// Publisher sends usage records to the stream. Publish never blocks; Run
// does the work. Make one with NewPublisher.
type Publisher struct {
	cfg     PublisherConfig
	js      jetstream.JetStream
	subject string
	log     *slog.Logger
	wg      sync.WaitGroup

	// The buffer grows only while JetStream lags: a slice under a lock,
	// not a channel of MaxBuffered records allocated up front.
	mu      sync.Mutex
	queue   []schemas.UsageRecord
	wake    chan struct{} // a token when queue has records
	pending atomic.Int64  // records queued or being published: Flush's measure

	published, fallback, dropped prometheus.Counter
}

// NewPublisher makes a publisher on nc; call Run.
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Source == "" {
		cfg.Source = "gateway"
	}
	if cfg.MaxBuffered <= 0 {
		cfg.MaxBuffered = 100_000
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 250 * time.Millisecond
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, js: js, subject: schemas.UsagePrefix + cfg.Source, log: log,
		wake: make(chan struct{}, 1),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_published_total",
			Help: "Usage records stored in the JetStream usage stream (publish acknowledged).",
		}),
		fallback: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_fallback_total",
			Help: "Usage records JetStream refused that were written straight to Redis instead.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_usage_dropped_total",
			Help: "Usage records lost: the publish buffer was full, or records were still unpublished at shutdown.",
		}),
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(p.published, p.fallback, p.dropped,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tokenbus_usage_buffered",
				Help: "Usage records waiting in memory to be published (JetStream slow, down or full).",
			}, func() float64 { return float64(p.Pending()) }))
	}
	return p, nil
}

// Publish queues a record; it never blocks. Past MaxBuffered the record is
// dropped, counted and logged.
func (p *Publisher) Publish(rec schemas.UsageRecord) {
	p.mu.Lock()
	if len(p.queue) >= p.cfg.MaxBuffered {
		p.mu.Unlock()
		p.dropped.Inc()
		p.log.Error("usage record dropped: publish buffer full", "request_id", rec.RequestID, "key_id", rec.KeyID,
			"model", rec.Model, "buffered", p.cfg.MaxBuffered)
		return
	}
	p.queue = append(p.queue, rec)
	p.pending.Add(1)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take pops the oldest record; false when there is none.
func (p *Publisher) take() (schemas.UsageRecord, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		if cap(p.queue) > 1024 {
			p.queue = nil // an outage's buffer is not kept for ever
		}
		return schemas.UsageRecord{}, false
	}
	rec := p.queue[0]
	p.queue[0] = schemas.UsageRecord{}
	p.queue = p.queue[1:]
	if len(p.queue) > 0 {
		select { // more for the other workers
		case p.wake <- struct{}{}:
		default:
		}
	}
	return rec, true
}

// Pending counts the records not yet published.
func (p *Publisher) Pending() int { return int(p.pending.Load()) }

// Run publishes until ctx ends; records still held then are dropped (and
// counted): call Flush first to give them time.
func (p *Publisher) Run(ctx context.Context) {
	for range p.cfg.Workers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.work(ctx)
		}()
	}
	p.wg.Wait()
	p.mu.Lock()
	n := len(p.queue)
	p.queue = nil
	p.mu.Unlock()
	if n > 0 {
		p.pending.Add(int64(-n))
		p.dropped.Add(float64(n))
		p.log.Error("usage records dropped: unpublished at shutdown", "records", n)
	}
}

func (p *Publisher) work(ctx context.Context) {
	for {
		rec, ok := p.take()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
				continue
			}
		}
		ok = p.deliver(ctx, rec)
		p.pending.Add(-1)
		if !ok {
			p.dropped.Inc()
			p.log.Error("usage record dropped: unpublished at shutdown", "request_id", rec.RequestID, "key_id", rec.KeyID)
			return
		}
	}
}

// deliver publishes rec, retrying until it is stored or ctx ends.
func (p *Publisher) deliver(ctx context.Context, rec schemas.UsageRecord) bool {
	b, _ := json.Marshal(rec)
	logged := false
	for {
		err := p.publish(ctx, rec, b)
		if err == nil {
			p.published.Inc()
			return true
		}
		if p.cfg.Fallback != nil {
			fctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
			ferr := p.cfg.Fallback(fctx, rec)
			cancel()
			if ferr == nil {
				p.fallback.Inc()
				return true
			}
		}
		if !logged { // once per record: an outage would flood the log
			p.log.Warn("usage record not published yet; holding it", "request_id", rec.RequestID, "err", err)
			logged = true
		}
		t := time.NewTimer(p.cfg.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

func (p *Publisher) publish(ctx context.Context, rec schemas.UsageRecord, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	_, err := p.js.Publish(ctx, p.subject, b, jetstream.WithMsgID(msgID(rec)))
	return err
}

// Flush waits until every record queued so far is published (or handed
// to the fallback), or ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for p.Pending() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
