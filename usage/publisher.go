package usage

import (
	"context"
	"log/slog"
	"strconv"
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
	// Linger is how long a record may wait for others to share its message:
	// one JetStream publish, and at the consumer one Redis call, for the
	// records of many requests instead of one each, which was most of the
	// CPU usage accounting cost per request. Default 200ms; below 0: none.
	Linger time.Duration
	// MaxBatch bounds the records in one message. Default 256.
	MaxBatch int
	// Fallback, if set, is tried when JetStream refuses a batch of records:
	// e.g. a gateway's registry.Limiter.RecordBatch, writing them straight
	// to Redis. Records it took are done.
	Fallback func(ctx context.Context, recs []schemas.UsageRecord) error
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
	mu       sync.Mutex
	queue    []schemas.UsageRecord
	oldest   time.Time     // when queue's first record came
	wake     chan struct{} // a token when queue got its first record, or a full batch
	pending  atomic.Int64  // records queued or being published: Flush's measure
	flushing atomic.Int32  // Flush calls waiting: no lingering meanwhile

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
	if cfg.Linger == 0 {
		cfg.Linger = 200 * time.Millisecond
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
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
				Help: "Usage records waiting in memory to be published: up to the linger (200 ms) for a batch, longer while JetStream is slow, down or full.",
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
	if len(p.queue) == 0 {
		p.oldest = time.Now()
	}
	p.queue = append(p.queue, rec)
	n := len(p.queue)
	p.pending.Add(1)
	p.mu.Unlock()
	// The publishing goroutines sleep out the linger: they are woken for
	// a first record or a full batch, not for every record.
	if n == 1 || n == p.cfg.MaxBatch {
		p.kick()
	}
}

func (p *Publisher) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take pops a batch of the oldest records, if they are due: a full batch,
// or the oldest has waited Linger, or a Flush waits. Otherwise it returns
// how long until they are due (0: the queue is empty).
func (p *Publisher) take(now time.Time) ([]schemas.UsageRecord, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		if cap(p.queue) > 1024 {
			p.queue = nil // an outage's buffer is not kept for ever
		}
		return nil, 0
	}
	n := min(len(p.queue), p.cfg.MaxBatch)
	if wait := p.cfg.Linger - now.Sub(p.oldest); n < p.cfg.MaxBatch && wait > 0 && p.flushing.Load() == 0 {
		return nil, wait
	}
	batch := make([]schemas.UsageRecord, n)
	copy(batch, p.queue)
	clear(p.queue[:n])
	p.queue = p.queue[n:]
	if len(p.queue) > 0 {
		p.oldest = now // the rest waits its own linger, from now
		p.kick()       // and another worker may take a full batch
	}
	return batch, 0
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
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		batch, wait := p.take(time.Now())
		if batch == nil {
			var due <-chan time.Time
			if wait > 0 {
				linger.Reset(wait)
				due = linger.C
			}
			select {
			case <-ctx.Done():
				linger.Stop()
				return
			case <-p.wake:
			case <-due:
			}
			linger.Stop()
			continue
		}
		ok := p.deliver(ctx, batch)
		p.pending.Add(int64(-len(batch)))
		if !ok {
			p.dropped.Add(float64(len(batch)))
			p.log.Error("usage records dropped: unpublished at shutdown", "records", len(batch),
				"request_id", batch[0].RequestID, "key_id", batch[0].KeyID)
			return
		}
	}
}

// deliver publishes batch as one message, retrying until it is stored or
// ctx ends.
func (p *Publisher) deliver(ctx context.Context, batch []schemas.UsageRecord) bool {
	b := EncodeRecords(nil, batch)
	// The same batch gets the same id when it is sent again after a lost
	// ack: JetStream stores it once.
	id := msgID(batch[0])
	if len(batch) > 1 {
		id += "+" + strconv.Itoa(len(batch)-1)
	}
	logged := false
	for {
		err := p.publish(ctx, id, b)
		if err == nil {
			p.published.Add(float64(len(batch)))
			return true
		}
		if p.cfg.Fallback != nil {
			fctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
			ferr := p.cfg.Fallback(fctx, batch)
			cancel()
			if ferr == nil {
				p.fallback.Add(float64(len(batch)))
				return true
			}
		}
		if !logged { // once per batch: an outage would flood the log
			p.log.Warn("usage records not published yet; holding them", "records", len(batch),
				"request_id", batch[0].RequestID, "err", err)
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

func (p *Publisher) publish(ctx context.Context, id string, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	_, err := p.js.Publish(ctx, p.subject, b, jetstream.WithMsgID(id))
	return err
}

// Flush waits until every record queued so far is published (or handed
// to the fallback), or ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	p.flushing.Add(1)
	defer p.flushing.Add(-1)
	p.kick()
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
