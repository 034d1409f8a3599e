package registry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

func testStoreCRUD(t *testing.T, b *backend) {
	ctx := context.Background()
	s := b.store(t)
	if err := s.PutModel(ctx, registry.Model{Name: "meta-llama/Llama-3.1-8B", MaxModelLen: 8192}); err != nil {
		t.Fatal(err)
	}
	created, err := s.EnsureModel(ctx, registry.Model{Name: "meta-llama/Llama-3.1-8B", MaxModelLen: 1})
	if err != nil || created {
		t.Fatalf("EnsureModel over an existing model: created=%v err=%v", created, err)
	}
	if created, err := s.EnsureModel(ctx, registry.Model{Name: "lora-a", Base: "meta-llama/Llama-3.1-8B", Path: "/w/a"}); err != nil || !created {
		t.Fatalf("EnsureModel new: %v %v", created, err)
	}
	m, err := s.Model(ctx, "meta-llama/Llama-3.1-8B")
	if err != nil || m.MaxModelLen != 8192 || m.Created == 0 {
		t.Fatalf("Model = %+v, %v", m, err)
	}
	list, err := s.Models(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "lora-a" || !list[0].IsAdapter() {
		t.Fatalf("Models = %+v, %v", list, err)
	}
	if err := s.DeleteModel(ctx, "lora-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteModel(ctx, "lora-a"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Model(ctx, "lora-a"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("deleted model: %v", err)
	}
}

func TestCacheFollowsEventsAndSurvivesOutage(t *testing.T) {
	r := testenv.StartRedis(t)
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := registry.Open(ctx, r.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := registry.NewCache(s, nil)
	// Run refreshes fully at start: m0 shows that refresh is done, so m1,
	// written after it, can only arrive through the event.
	if err := s.PutModel(ctx, registry.Model{Name: "m0"}); err != nil {
		t.Fatal(err)
	}
	// Poll rarely: only the event can make the change visible quickly.
	go c.Run(ctx, nc, time.Hour)
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !c.Known("m0") {
			return fmt.Errorf("first refresh not done yet")
		}
		return nil
	})
	if err := s.PutModel(ctx, registry.Model{Name: "m1"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		// Announce on every pass: the subscription may not be active yet.
		if err := registry.Announce(nc, "m1"); err != nil {
			return err
		}
		if !c.Known("m1") {
			return fmt.Errorf("m1 not in cache yet")
		}
		return nil
	})
	if !c.Up() {
		t.Fatal("Up is false after good refreshes")
	}
	if got := c.Models(); len(got) != 2 || got[0].Name != "m0" || got[1].Name != "m1" {
		t.Fatalf("Models %+v, want m0 and m1", got)
	}
	r.Stop()
	if err := c.Refresh(ctx); err == nil {
		t.Fatal("refresh with Redis down should fail")
	}
	if !c.Known("m1") || len(c.Models()) != 2 {
		t.Fatal("the cache forgot m1 during a Redis outage")
	}
	if c.Up() {
		t.Fatal("Up is true after a failed refresh (tokenbus_redis_up would not tell)")
	}
}
