package responses

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// TestLegacyWorkQueue: a work queue made by a tokenbus from before issue
// 32 (one subject per response, one unfiltered consumer "runners", the
// server's default limits) is taken over by Open and a Runner: the limits
// set, the old consumer narrowed to the old subjects so that per-tenant
// consumers can join it, and the work queued the old way still taken.
func TestLegacyWorkQueue(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// As the old Open made them.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: WorkStream, Subjects: []string{WorkPrefix + "*"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: EventStream, Subjects: []string{EventPrefix + "*"},
		Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, WorkStream, jetstream.ConsumerConfig{Durable: legacyConsumer,
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 20}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.events.Info(ctx)
	if err != nil || info.Config.MaxConsumers != eventConsumers || info.Config.Discard != jetstream.DiscardNew || info.Config.MaxBytes <= 0 {
		t.Fatalf("events stream after Open: %v %+v", err, info.Config)
	}
	// Work of both kinds of queue: an old one and a new one (both already
	// ended, so that the runner only acknowledges them).
	for _, id := range []string{"resp_old", "resp_new"} {
		rec := &Record{Response: Response{ID: id, Status: StatusCompleted}, Tenant: "acme"}
		if err := s.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: WorkPrefix + "resp_old", Data: []byte("resp_old")}); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	r := NewRunner(s, nil, RunnerConfig{Poll: 50 * time.Millisecond})
	go func() { _ = r.Run(rctx) }()
	if err := s.Submit(ctx, &Record{Response: Response{ID: "resp_new", Status: StatusCompleted}, Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		info, err := s.work.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs > 0 {
			return fmt.Errorf("%d messages still queued", info.State.Msgs)
		}
		return nil
	})
	c, err := s.work.Consumer(ctx, legacyConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.CachedInfo().Config.FilterSubject; f != WorkPrefix+"*" {
		t.Fatalf("the old consumer's filter: %q", f)
	}
}

// TestFollowers: follows are counted per tenant and in all, and given back.
func TestFollowers(t *testing.T) {
	f := newFollowers(3, 2)
	a1, err := f.take("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.take("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.take("a"); err == nil || err.Error() == "" {
		t.Fatal("a third follow of a: allowed")
	}
	if _, err := f.take("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.take("c"); err == nil {
		t.Fatal("a fourth follow in all: allowed")
	}
	a1()
	a1() // once only
	if _, err := f.take("c"); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	if _, err := f.take("c"); err == nil {
		t.Fatal("a second release counted twice")
	}
}
