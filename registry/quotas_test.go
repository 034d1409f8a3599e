package registry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// A tenant's record: 0 takes the default, negative is no limit; the
// resolved quotas say no limit with 0.
func TestQuotasResolve(t *testing.T) {
	def := registry.Quotas{FileBytes: 100, Files: 10, Batches: 0, StoredResponses: 5}
	got := registry.Quotas{FileBytes: 7, Files: -1, Batches: 3}.Resolve(def)
	want := registry.Quotas{FileBytes: 7, Files: 0, Batches: 3, StoredResponses: 5}
	if got != want {
		t.Fatalf("Resolve = %+v, want %+v", got, want)
	}
	if got := (registry.Quotas{}).Resolve(registry.Quotas{Files: -5}); got != (registry.Quotas{}) {
		t.Fatalf("a negative default: %+v", got)
	}
}

// Quotas live in Redis per tenant; the cache serves them without a round
// trip, forgets a tenant on its event, and serves what it knows (or the
// defaults) while Redis is down.
func TestQuotaCache(t *testing.T) {
	s, rd := openStore(t)
	ctx := context.Background()
	nc := testenv.Connect(t, testenv.NATS(t))
	def := registry.Quotas{FileBytes: 1000, Files: 10, Batches: 2}
	if err := s.SetTenantQuotas(ctx, "acme", registry.Quotas{Files: 3, Batches: -1}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTenantQuotas(ctx, "", registry.Quotas{Files: 3}); err == nil {
		t.Fatal("a quota for the tenant \"\" was taken")
	}
	if _, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "keyed"}); err != nil {
		t.Fatal(err)
	}
	if ts, err := s.Tenants(ctx); err != nil || len(ts) != 2 || ts[0] != "acme" || ts[1] != "keyed" {
		t.Fatalf("Tenants = %v, %v", ts, err)
	}
	c := registry.NewQuotaCache(s, def, time.Hour, nil)
	stop, err := c.Subscribe(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	want := registry.Quotas{FileBytes: 1000, Files: 3}
	if q, err := c.Lookup(ctx, "acme"); err != nil || q != want {
		t.Fatalf("acme: %+v %v, want %+v", q, err, want)
	}
	if q, _ := c.Lookup(ctx, "nobody"); q != def {
		t.Fatalf("a tenant without a record: %+v", q)
	}
	// Cached: a change without its event is not seen (TTL an hour)...
	if err := s.SetTenantQuotas(ctx, "acme", registry.Quotas{Files: 4}); err != nil {
		t.Fatal(err)
	}
	if q, _ := c.Lookup(ctx, "acme"); q.Files != 3 {
		t.Fatalf("not cached: %+v", q)
	}
	// ...and is, at once, with it.
	if err := registry.AnnounceQuotas(nc, "acme"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if q, _ := c.Lookup(ctx, "acme"); q.Files != 4 {
			return fmt.Errorf("after the event: %+v", q)
		}
		return nil
	})
	// A cache that asks Redis every time it is used (TTL 1ms), to see what
	// it does when Redis is gone.
	short := registry.NewQuotaCache(s, def, time.Millisecond, nil)
	if q, _ := short.Lookup(ctx, "acme"); q.Files != 4 {
		t.Fatalf("short TTL: %+v", q)
	}
	// All zero: the record goes, the defaults apply.
	if err := s.SetTenantQuotas(ctx, "acme", registry.Quotas{}); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.AllTenantQuotas(ctx); len(all) != 0 {
		t.Fatalf("records after a reset: %v", all)
	}
	c.Purge()
	if q, _ := c.Lookup(ctx, "acme"); q != def {
		t.Fatalf("reset: %+v", q)
	}
	rd.Stop()
	// Known: the last answer is served on (past its TTL); unknown: the
	// defaults, no error (Redis is not on an upload's critical path).
	if q, err := short.Lookup(ctx, "acme"); err != nil || q.Files != 4 {
		t.Fatalf("known, Redis down: %+v %v", q, err)
	}
	if q, err := short.Lookup(ctx, "never-asked"); err != nil || q != def {
		t.Fatalf("unknown, Redis down: %+v %v", q, err)
	}
	// Without a store: the defaults.
	if q, err := registry.NewQuotaCache(nil, def, 0, nil).Lookup(ctx, "x"); err != nil || q != def {
		t.Fatalf("no store: %+v %v", q, err)
	}
}
