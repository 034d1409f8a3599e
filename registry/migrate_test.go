package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// A registry in the layout before Cluster support, on one node, copied
// into the backend: every key still works by its secret, with its window;
// usage, hourly usage, quotas and models are there; a usage record the old
// layout had counted counts once; running it again changes nothing.
func testMigrate(t *testing.T, b *backend) {
	ctx := context.Background()
	old := testenv.StartRedis(t)
	src := redis.NewClient(&redis.Options{Addr: old.Addr})
	defer src.Close()
	s := b.store(t)
	l, clock := newLimiter(s)
	now := clock.now()
	win := now.UnixMilli() / 60000
	hour, day := now.Unix()/3600, now.Unix()/86400
	const id, secret = "key_0123456789abcdef01234567", "tb-an-old-secret"
	hash := registry.HashSecret(secret)
	rec, _ := json.Marshal(map[string]any{"id": id, "name": "old", "tenant": "acme", "models": []string{}, "rpm": 5,
		"redacted_key": "tb-...cret", "created": 1, "hash": hash})
	period := time.Now().UnixMilli() / registry.UsageSeenTTL.Milliseconds()
	_, err := src.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, "{tokenbus}:models", "m", `{"name":"m","created":1}`)
		p.HSet(ctx, "{tokenbus}:quotas", "acme", `{"files":3}`)
		p.HSet(ctx, "{tokenbus}:keys", id, rec)
		p.HSet(ctx, "{tokenbus}:keyhash", hash, id)
		p.HSet(ctx, "{tokenbus}:rl:"+id, "w", win, "r", 2, "t", 0)
		p.PExpire(ctx, "{tokenbus}:rl:"+id, 2*time.Minute)
		p.SAdd(ctx, "{tokenbus}:usage:keys", id)
		p.HSet(ctx, "{tokenbus}:usage:"+id, "requests|m", 3, "prompt_tokens|m", 30, "completion_tokens|m", 15)
		hk := fmt.Sprintf("{tokenbus}:usage:hourly:%s:%d", id, day)
		p.HSet(ctx, hk, fmt.Sprintf("%d|requests|m", hour), 3, fmt.Sprintf("%d|prompt_tokens|m", hour), 30,
			fmt.Sprintf("%d|completion_tokens|m", hour), 15)
		p.PExpire(ctx, hk, time.Hour)
		p.SAdd(ctx, fmt.Sprintf("{tokenbus}:usage:seen:%d", period), id+":req-1")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	oldStore := registry.NewStore(src)
	if o, err := oldStore.OldLayout(ctx); err != nil || !o {
		t.Fatalf("OldLayout of the old data: %v %v", o, err)
	}
	for run := range 2 {
		m, err := registry.Migrate(ctx, src, s)
		if err != nil {
			t.Fatal(err)
		}
		if m.Models != 1 || m.Keys != 1 || m.Quotas != 1 || m.RateWindows != 1 || m.UsageKeys != 1 || m.HourlyHashes != 1 || m.SeenIDs != 1 {
			t.Fatalf("run %d: migrated %s", run+1, m)
		}
		if o, err := s.OldLayout(ctx); err != nil || o {
			t.Fatalf("OldLayout after the migration: %v %v", o, err)
		}
		k, err := s.KeyByHash(ctx, hash)
		if err != nil || k.ID != id || k.RPM != 5 || k.Tenant != "acme" {
			t.Fatalf("run %d: the old secret finds %+v, %v", run+1, k, err)
		}
		if ms, err := s.Models(ctx); err != nil || len(ms) != 1 || ms[0].Name != "m" {
			t.Fatalf("models %+v %v", ms, err)
		}
		if q, err := s.TenantQuotas(ctx, "acme"); err != nil || q.Files != 3 {
			t.Fatalf("quotas %+v %v", q, err)
		}
		rows, err := s.Usage(ctx, "", "")
		if err != nil || len(rows) != 1 || rows[0].Requests != 3 || rows[0].TotalTokens != 45 {
			t.Fatalf("usage %+v %v", rows, err)
		}
		hourly, err := s.UsageHourly(ctx, id, "", now.Add(-time.Hour), now)
		if err != nil || len(hourly) != 1 || hourly[0].Requests != 3 {
			t.Fatalf("hourly %+v %v", hourly, err)
		}
	}
	// The window came along: 2 of the key's 5 requests are taken.
	if d, err := l.Admit(ctx, registry.Key{ID: id, KeySpec: registry.KeySpec{RPM: 5}}, registry.Admission{}); err != nil || d.RemainingRequests() != 2 {
		t.Fatalf("admit after the move: %+v %v", d, err)
	}
	// req-1 was counted in the old layout: delivered again, it is a duplicate.
	dup, err := registry.NewLimiter(s).Record(ctx, schemas.UsageRecord{RequestID: "req-1", KeyID: id, Model: "m",
		Usage: schemas.Usage{PromptTokens: 1}})
	if err != nil || !dup {
		t.Fatalf("a record counted before the move: dup %v, %v", dup, err)
	}
}
