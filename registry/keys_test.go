package registry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

func testKeys(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Name: "ci", Tenant: "acme", Models: []string{"llama-8b"}, RPM: 60, TPM: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "tb-") || len(secret) != 3+43 || !strings.HasPrefix(k.ID, "key_") ||
		k.Hint != "tb-..."+secret[len(secret)-4:] || k.Created == 0 {
		t.Fatalf("key %+v secret %q", k, secret)
	}
	_, secret2, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "other"})
	if err != nil || secret2 == secret {
		t.Fatalf("second key: %v", err)
	}

	got, err := s.KeyByHash(ctx, registry.HashSecret(secret))
	if err != nil || got.ID != k.ID || got.Tenant != "acme" || got.RPM != 60 || got.TPM != 1000 ||
		!got.Allows("llama-8b") || got.Allows("other") {
		t.Fatalf("KeyByHash = %+v, %v", got, err)
	}
	list, err := s.ListKeys(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("ListKeys = %+v, %v", list, err)
	}
	for _, l := range list {
		if l.ID != k.ID && (l.Tenant != "other" || !l.Allows("anything")) {
			t.Fatalf("ListKeys = %+v", list)
		}
	}

	// The secret is nowhere in Redis: not in a key name, a field or a value.
	for _, sec := range []string{secret, secret2, strings.TrimPrefix(secret, "tb-")} {
		if where := findInRedis(t, s.Client(), sec); where != "" {
			t.Fatalf("the secret is stored in Redis: %s", where)
		}
	}

	if err := s.DeleteKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "deleted key by hash", func() error { _, err := s.KeyByHash(ctx, registry.HashSecret(secret)); return err }(), registry.ErrNotFound, 404)
	wantErr(t, "delete again", s.DeleteKey(ctx, k.ID), registry.ErrNotFound, 404)
	if n := len(keysLike(t, s.Client(), "tokenbus:secret:*")); n != 1 {
		t.Fatalf("%d secret entries after the delete, want 1", n)
	}

	for _, tc := range []struct {
		spec  registry.KeySpec
		param string
	}{
		{registry.KeySpec{}, "tenant"},
		{registry.KeySpec{Tenant: "a\nb"}, "tenant"},
		{registry.KeySpec{Tenant: "t", RPM: -1}, "rpm"},
		{registry.KeySpec{Tenant: "t", TPM: -1}, "tpm"},
		{registry.KeySpec{Tenant: "t", Models: []string{""}}, "models"},
	} {
		_, _, err := s.CreateKey(ctx, tc.spec)
		wantErr(t, fmt.Sprintf("%+v", tc.spec), err, registry.ErrInvalid, 400)
		if p := schemas.AsError(err).Body.Param; p == nil || *p != tc.param {
			t.Fatalf("%+v: param %v", tc.spec, p)
		}
	}
}

// findInRedis scans every key, and every string, hash, set and list in
// Redis, for s; it returns where it found it.
func findInRedis(t *testing.T, rdb redis.UniversalClient, s string) string {
	t.Helper()
	ctx := context.Background()
	keys := keysLike(t, rdb, "*")
	if len(keys) == 0 {
		t.Fatal("no keys in Redis at all")
	}
	for _, k := range keys {
		if strings.Contains(k, s) {
			return "key name " + k
		}
		var vals []string
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "string":
			vals = []string{rdb.Get(ctx, k).Val()}
		case "hash":
			for f, v := range rdb.HGetAll(ctx, k).Val() {
				vals = append(vals, f, v)
			}
		case "set":
			vals = rdb.SMembers(ctx, k).Val()
		case "list":
			vals = rdb.LRange(ctx, k, 0, -1).Val()
		default:
			t.Fatalf("key %s of type %s not inspected", k, typ)
		}
		for _, v := range vals {
			if strings.Contains(v, s) {
				return "value of " + k
			}
		}
	}
	return ""
}

// keysLike is every key matching pattern, on every master of a Cluster.
func keysLike(t *testing.T, rdb redis.UniversalClient, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		keys, err := rdb.Keys(ctx, pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	var mu sync.Mutex
	var keys []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		k, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, k...)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// A cached key works without Redis; an event drops it at once; while Redis
// is down, known keys keep working and unknown ones are ErrUnavailable.
func TestKeyCache(t *testing.T) {
	s, r := openStore(t)
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	ctx := context.Background()
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	c := registry.NewKeyCache(s, time.Hour, nil)
	stop, err := c.Subscribe(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got, err := c.Lookup(ctx, secret); err != nil || got.ID != k.ID {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	wantErr(t, "unknown secret", func() error { _, err := c.Lookup(ctx, "tb-nope"); return err }(), registry.ErrNotFound, 404)
	// By id (a dispatcher's tenant requests), cached the same way.
	if got, err := c.Key(ctx, k.ID); err != nil || got.ID != k.ID || got.Tenant != "acme" {
		t.Fatalf("Key(id) = %+v, %v", got, err)
	}
	wantErr(t, "unknown id", func() error { _, err := c.Key(ctx, "key_nope"); return err }(), registry.ErrNotFound, 404)

	// Deleted behind the cache's back: still served from the cache...
	if err := s.DeleteKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, secret); err != nil {
		t.Fatalf("cached key: %v", err)
	}
	if _, err := c.Key(ctx, k.ID); err != nil {
		t.Fatalf("cached key by id: %v", err)
	}
	// ...until the event, with a TTL of an hour: the event did it.
	pub := testenv.Connect(t, ns)
	if err := registry.AnnounceKeys(pub, k.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if _, err := c.Lookup(ctx, secret); err == nil {
			return fmt.Errorf("deleted key still works")
		}
		return nil
	})
	wantErr(t, "deleted id after the event", func() error { _, err := c.Key(ctx, k.ID); return err }(), registry.ErrNotFound, 404)

	// Redis down: a key seen before works even past its TTL; others get 503.
	k2, secret2, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	short := registry.NewKeyCache(s, time.Nanosecond, nil)
	if _, err := short.Lookup(ctx, secret2); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	for range 3 {
		if got, err := short.Lookup(ctx, secret2); err != nil || got.ID != k2.ID {
			t.Fatalf("known key with Redis down: %+v, %v", got, err)
		}
	}
	wantErr(t, "unknown secret, Redis down", func() error { _, err := short.Lookup(ctx, "tb-other"); return err }(), registry.ErrUnavailable, 503)
	// A purge (a key event) forgets it even then: it might be the deleted one.
	short.Purge()
	wantErr(t, "purged key, Redis down", func() error { _, err := short.Lookup(ctx, secret2); return err }(), registry.ErrUnavailable, 503)
}

// Keys created concurrently all work and have distinct ids.
func testCreateKeysConcurrently(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	secrets := map[string]string{}
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, sec, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "t"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			secrets[sec] = k.ID
			mu.Unlock()
		}()
	}
	wg.Wait()
	ids := map[string]bool{}
	for sec, id := range secrets {
		k, err := s.KeyByHash(ctx, registry.HashSecret(sec))
		if err != nil || k.ID != id || ids[id] {
			t.Fatalf("%s: %+v %v", id, k, err)
		}
		ids[id] = true
	}
	if len(ids) != 20 {
		t.Fatalf("%d keys", len(ids))
	}
}

// A key's flow control: set at creation, changed with SetKeyFlow (fields
// left nil stay), checked like at creation; the secret still finds the key.
func testKeyFlow(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	if _, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme", Band: "urgent"}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("band urgent: %v", err)
	}
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme", Band: "batch", Weight: 3, MaxQueueMS: 2000})
	if err != nil || k.FlowBand() != schemas.BandBatch {
		t.Fatalf("create: %+v %v", k, err)
	}
	band, weight := "critical", 1001
	if _, err := s.SetKeyFlow(ctx, k.ID, registry.FlowPolicy{Weight: &weight}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("weight 1001: %v", err)
	}
	weight = 5
	got, err := s.SetKeyFlow(ctx, k.ID, registry.FlowPolicy{Band: &band, Weight: &weight})
	if err != nil || got.Band != "critical" || got.Weight != 5 || got.MaxQueueMS != 2000 {
		t.Fatalf("SetKeyFlow: %+v %v", got, err)
	}
	if byHash, err := s.KeyByHash(ctx, registry.HashSecret(secret)); err != nil || byHash.FlowBand() != schemas.BandCritical || byHash.Weight != 5 {
		t.Errorf("the key by its secret after the change: %+v %v", byHash, err)
	}
	if _, err := s.SetKeyFlow(ctx, "key_none", registry.FlowPolicy{Band: &band}); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
}
