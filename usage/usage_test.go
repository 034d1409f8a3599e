package usage_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/usage"
)

// recorder is an in-memory usage.Recorder, idempotent by request id as
// registry.Limiter is, that can be made to fail like a Redis that is down.
type recorder struct {
	mu     sync.Mutex
	down   bool
	seen   map[string]int // request id -> times delivered
	tokens int
	calls  int
}

func newRecorder() *recorder { return &recorder{seen: map[string]int{}} }

var errDown = errors.New("redis down")

func (r *recorder) RecordBatch(_ context.Context, recs []schemas.UsageRecord) (dups int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.down {
		return 0, errDown
	}
	for _, rec := range recs {
		r.seen[rec.RequestID]++
		if r.seen[rec.RequestID] > 1 {
			dups++
			continue
		}
		r.tokens += rec.Usage.TotalTokens
	}
	return dups, nil
}

func (r *recorder) setDown(down bool) {
	r.mu.Lock()
	r.down = down
	r.mu.Unlock()
}

func (r *recorder) state() (records, tokens, calls int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen), r.tokens, r.calls
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func record(i int) schemas.UsageRecord {
	return schemas.UsageRecord{RequestID: fmt.Sprintf("req-%d", i), KeyID: "key_1", Model: "m",
		Usage: schemas.Usage{PromptTokens: 1, CompletionTokens: i, TotalTokens: 1 + i}}
}

// Records published while the recorder (Redis) is down wait in the stream
// and are written once it is back, each exactly once, though deliveries are
// retried; two consumers (two gateways) share them. They travel in batches:
// far fewer messages than records.
func TestRecordsWaitForRedis(t *testing.T) {
	ns := testenv.NATS(t)
	rec := newRecorder()
	rec.setDown(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	reg := prometheus.NewRegistry()
	for i := range 2 {
		nc := testenv.Connect(t, ns)
		cfg := usage.ConsumerConfig{Retry: 50 * time.Millisecond}
		if i == 0 {
			cfg.Metrics = reg
		}
		wg.Add(1)
		go func() { defer wg.Done(); usage.Consume(ctx, nc, rec, cfg) }()
	}
	defer wg.Wait()
	defer cancel()

	pub, err := usage.NewPublisher(testenv.Connect(t, ns), usage.PublisherConfig{Source: "worker"})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopPub := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pub.Run(pctx); close(done) }()
	defer func() { stopPub(); <-done }()

	const n = 300
	want := 0
	for i := range n {
		pub.Publish(record(i))
		want += 1 + i
	}
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	if err := pub.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	// Redis down: deliveries are tried and refused, nothing is counted.
	testenv.WaitFor(t, 5*time.Second, func() error {
		if _, _, calls := rec.state(); calls == 0 {
			return errors.New("no delivery tried yet")
		}
		return nil
	})
	if records, _, _ := rec.state(); records != 0 {
		t.Fatalf("%d records counted with Redis down", records)
	}
	rec.setDown(false)
	testenv.WaitFor(t, 10*time.Second, func() error {
		if records, tokens, _ := rec.state(); records != n || tokens != want {
			return fmt.Errorf("%d records, %d tokens; want %d, %d", records, tokens, n, want)
		}
		return nil
	})
	rec.mu.Lock()
	for id, times := range rec.seen {
		if times != 1 {
			t.Errorf("%s delivered %d times after the outage", id, times)
		}
	}
	rec.mu.Unlock()
	// 300 records published at once, at most 256 a message: a few messages
	// (each taken by one of the 4 publishing goroutines as it came due).
	js, err := jetstream.New(testenv.Connect(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, usage.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if msgs := info.State.LastSeq; msgs < 2 || msgs > 8 {
		t.Fatalf("%d records went in %d messages; want them batched (2 to 8 messages)", n, msgs)
	}
}

// A usage message is JSON Lines of records; a line that is no record is
// reported, the others are read.
func TestRecordsEncoding(t *testing.T) {
	recs := []schemas.UsageRecord{record(1), record(2), record(3)}
	b := usage.EncodeRecords(nil, recs)
	got, bad := usage.DecodeRecords(b)
	if len(bad) != 0 || !reflect.DeepEqual(got, recs) {
		t.Fatalf("round trip: %+v, bad %v", got, bad)
	}
	tests := []struct {
		name      string
		in        string
		recs, bad int
	}{
		{"one record, as older publishers send", `{"request_id":"r1","model":"m"}`, 1, 0},
		{"blank lines skipped", "\n" + `{"request_id":"r1"}` + "\n\n" + `{"request_id":"r2"}` + "\n", 2, 0},
		{"bad JSON among good", `{"request_id":"r1"}` + "\n{oops\n" + `{"request_id":"r2"}`, 2, 1},
		{"no request id", `{"model":"m"}`, 0, 1},
		{"empty", "", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs, bad := usage.DecodeRecords([]byte(tc.in))
			if len(recs) != tc.recs || len(bad) != tc.bad {
				t.Fatalf("%d records, %d bad; want %d, %d", len(recs), len(bad), tc.recs, tc.bad)
			}
		})
	}
}

// A trickle of records waits out the linger and goes in one message; Flush
// does not wait for the linger.
func TestPublisherLinger(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := usage.EnsureStream(ctx, js, usage.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := usage.NewPublisher(nc, usage.PublisherConfig{Linger: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { pub.Run(pctx); close(done) }()
	defer func() { stop(); <-done }()
	for i := range 5 {
		pub.Publish(record(i))
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pub.Flush(fctx); err != nil {
		t.Fatalf("Flush waited for the hour's linger: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("5 records in %d messages; want 1", info.State.Msgs)
	}
}

// Without JetStream a publisher hands records to its fallback; without a
// fallback it holds them (bounded) and counts what it must drop.
func TestPublisherWithoutJetStream(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	t.Run("fallback", func(t *testing.T) {
		rec := newRecorder()
		reg := prometheus.NewRegistry()
		pub, err := usage.NewPublisher(nc, usage.PublisherConfig{Timeout: 200 * time.Millisecond, Metrics: reg,
			Fallback: func(ctx context.Context, r []schemas.UsageRecord) error {
				_, err := rec.RecordBatch(ctx, r)
				return err
			}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { pub.Run(ctx); close(done) }()
		for i := range 10 {
			pub.Publish(record(i))
		}
		fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer fcancel()
		if err := pub.Flush(fctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		<-done
		if records, _, _ := rec.state(); records != 10 || counter(t, reg, "tokenbus_usage_fallback_total") != 10 ||
			counter(t, reg, "tokenbus_usage_dropped_total") != 0 {
			t.Fatalf("%d records through the fallback", records)
		}
	})

	t.Run("bounded buffer", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		pub, err := usage.NewPublisher(nc, usage.PublisherConfig{Timeout: 50 * time.Millisecond, Retry: 10 * time.Millisecond,
			MaxBuffered: 5, Workers: 1, Metrics: reg})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 8 { // nothing runs yet: 5 are held, 3 dropped
			pub.Publish(record(i))
		}
		if pub.Pending() != 5 || counter(t, reg, "tokenbus_usage_dropped_total") != 3 ||
			counter(t, reg, "tokenbus_usage_buffered") != 5 {
			t.Fatalf("pending %d, dropped %v", pub.Pending(), counter(t, reg, "tokenbus_usage_dropped_total"))
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { pub.Run(ctx); close(done) }()
		fctx, fcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer fcancel()
		if err := pub.Flush(fctx); err == nil {
			t.Fatal("flushed without JetStream")
		}
		cancel()
		<-done
		// What was held is dropped at the end, and counted.
		if pub.Pending() != 0 || counter(t, reg, "tokenbus_usage_dropped_total") != 8 {
			t.Fatalf("pending %d, dropped %v", pub.Pending(), counter(t, reg, "tokenbus_usage_dropped_total"))
		}
	})
}
