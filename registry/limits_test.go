package registry_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// pinnedClock is a settable clock for a Limiter.
type pinnedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *pinnedClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *pinnedClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newLimiter returns a limiter whose clock stands 10 s into a minute.
func newLimiter(s *registry.Store) (*registry.Limiter, *pinnedClock) {
	c := &pinnedClock{t: time.Unix(1_800_000_000/60*60+10, 0)}
	l := registry.NewLimiter(s)
	l.Now = c.now
	return l, c
}

func testRequestsPerMinute(t *testing.T, b *backend) {
	s := b.store(t)
	l, clock := newLimiter(s)
	ctx := context.Background()
	k := registry.Key{ID: "key_rpm", KeySpec: registry.KeySpec{RPM: 3}}
	for i, want := range []int{2, 1, 0} {
		d, err := l.Admit(ctx, k, registry.Admission{})
		if err != nil || !d.Allowed || d.RemainingRequests() != want || d.Reset != 50*time.Second || d.RPM != 3 {
			t.Fatalf("request %d: %+v %v", i+1, d, err)
		}
	}
	clock.add(20 * time.Second)
	d, err := l.Admit(ctx, k, registry.Admission{})
	if err != nil || d.Allowed || d.Exceeded != "requests" || d.RemainingRequests() != 0 || d.Reset != 30*time.Second {
		t.Fatalf("4th request: %+v %v", d, err)
	}
	// Refusals are not counted: the next window starts from zero.
	clock.add(30 * time.Second)
	if d, err := l.Admit(ctx, k, registry.Admission{}); err != nil || !d.Allowed || d.RemainingRequests() != 2 || d.Reset != time.Minute {
		t.Fatalf("next window: %+v %v", d, err)
	}
	// Other keys have their own counts; keys without limits skip Redis.
	if d, err := l.Admit(ctx, registry.Key{ID: "key_other", KeySpec: registry.KeySpec{RPM: 1}}, registry.Admission{}); err != nil || !d.Allowed {
		t.Fatalf("other key: %+v %v", d, err)
	}
	if d, err := l.Admit(ctx, registry.Key{ID: "key_free"}, registry.Admission{}); err != nil || !d.Allowed || d.RPM != 0 {
		t.Fatalf("unlimited key: %+v %v", d, err)
	}
}

func testTokensPerMinute(t *testing.T, b *backend) {
	s := b.store(t)
	l, clock := newLimiter(s)
	ctx := context.Background()
	k := registry.Key{ID: "key_tpm", KeySpec: registry.KeySpec{TPM: 100}}
	d, err := l.Admit(ctx, k, registry.Admission{})
	if err != nil || !d.Allowed || d.RemainingTokens() != 100 {
		t.Fatalf("first: %+v %v", d, err)
	}
	if _, err := l.Record(ctx, schemas.UsageRecord{KeyID: k.ID, Model: "m", Usage: schemas.Usage{PromptTokens: 40, CompletionTokens: 30}}); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Admit(ctx, k, registry.Admission{}); err != nil || !d.Allowed || d.RemainingTokens() != 30 || d.Tokens != 70 {
		t.Fatalf("after 70 tokens: %+v %v", d, err)
	}
	if _, err := l.Record(ctx, schemas.UsageRecord{KeyID: k.ID, Model: "m", Usage: schemas.Usage{PromptTokens: 40, CompletionTokens: 30}}); err != nil {
		t.Fatal(err)
	}
	d, err = l.Admit(ctx, k, registry.Admission{})
	if err != nil || d.Allowed || d.Exceeded != "tokens" || d.RemainingTokens() != 0 || d.Tokens != 140 || d.Reset != 50*time.Second {
		t.Fatalf("after 140 tokens: %+v %v", d, err)
	}
	// Tokens of a request that ends in the next window count there.
	clock.add(time.Minute)
	if _, err := l.Record(ctx, schemas.UsageRecord{KeyID: k.ID, Model: "m", Usage: schemas.Usage{TotalTokens: 25}}); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Admit(ctx, k, registry.Admission{}); err != nil || !d.Allowed || d.Tokens != 25 || d.Requests != 1 {
		t.Fatalf("next window: %+v %v", d, err)
	}
}

// Two gateways (two Stores on one Redis) and many goroutines never admit
// more than the limit in a window.
func testRequestsPerMinuteConcurrent(t *testing.T, b *backend) {
	s1 := b.store(t)
	s2 := b.open(t) // a second gateway
	l1, _ := newLimiter(s1)
	l2, _ := newLimiter(s2)
	k := registry.Key{ID: "key_race", KeySpec: registry.KeySpec{RPM: 25}}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		l := l1
		if g%2 == 1 {
			l = l2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				d, err := l.Admit(context.Background(), k, registry.Admission{})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := allowed.Load(); n != 25 {
		t.Fatalf("%d requests admitted, limit 25", n)
	}
}

// With no pinned clock the scripts use Redis's own.
func testLimiterRedisClock(t *testing.T, b *backend) {
	s := b.store(t)
	l := registry.NewLimiter(s)
	k := registry.Key{ID: "key_clock", KeySpec: registry.KeySpec{RPM: 1}}
	d, err := l.Admit(context.Background(), k, registry.Admission{})
	if err != nil || !d.Allowed || d.Reset <= 0 || d.Reset > time.Minute {
		t.Fatalf("%+v %v", d, err)
	}
	if _, err := l.Record(context.Background(), schemas.UsageRecord{KeyID: k.ID, Model: "m", Usage: schemas.Usage{PromptTokens: 1}}); err != nil {
		t.Fatal(err)
	}
}

func testUsage(t *testing.T, be *backend) {
	s := be.store(t)
	l := registry.NewLimiter(s)
	ctx := context.Background()
	a := registry.Key{ID: "key_a", KeySpec: registry.KeySpec{TPM: 1000}}
	b := registry.Key{ID: "key_b"}
	for _, rec := range []struct {
		k      registry.Key
		model  string
		p, c   int
		repeat int
	}{
		{a, "llama-8b", 10, 5, 3},
		{a, "org/model|x", 7, 1, 1},
		{b, "llama-8b", 2, 2, 2},
		{registry.Key{}, "llama-8b", 1, 1, 1},
	} {
		for range rec.repeat {
			if _, err := l.Record(ctx, schemas.UsageRecord{KeyID: rec.k.ID, Model: rec.model, Usage: schemas.Usage{PromptTokens: rec.p, CompletionTokens: rec.c}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	row := func(id, m string, req, p, c int64) registry.UsageRow {
		return registry.UsageRow{KeyID: id, Model: m, Requests: req, PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}
	}
	for _, tc := range []struct {
		key, model string
		want       []registry.UsageRow
	}{
		{"", "", []registry.UsageRow{row(registry.AnonymousKey, "llama-8b", 1, 1, 1),
			row("key_a", "llama-8b", 3, 30, 15), row("key_a", "org/model|x", 1, 7, 1), row("key_b", "llama-8b", 2, 4, 4)}},
		{"key_a", "", []registry.UsageRow{row("key_a", "llama-8b", 3, 30, 15), row("key_a", "org/model|x", 1, 7, 1)}},
		{"", "llama-8b", []registry.UsageRow{row(registry.AnonymousKey, "llama-8b", 1, 1, 1),
			row("key_a", "llama-8b", 3, 30, 15), row("key_b", "llama-8b", 2, 4, 4)}},
		{"key_b", "org/model|x", []registry.UsageRow{}},
		{"key_none", "", []registry.UsageRow{}},
	} {
		got, err := s.Usage(ctx, tc.key, tc.model)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("Usage(%q, %q) = %+v, want %+v", tc.key, tc.model, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("Usage(%q, %q) = %+v, want %+v", tc.key, tc.model, got, tc.want)
			}
		}
	}
}

// Usage per hour: each record counts in its hour, across a day's end; a
// window and a key or model narrow it; a redelivered record counts once.
func testUsageHourly(t *testing.T, b *backend) {
	s := b.store(t)
	l, clock := newLimiter(s)
	ctx := context.Background()
	start := clock.now().Truncate(time.Hour)
	rec := func(id, model string, p, c int, reqID string) {
		t.Helper()
		if _, err := l.Record(ctx, schemas.UsageRecord{RequestID: reqID, KeyID: id, Model: model, Usage: schemas.Usage{PromptTokens: p, CompletionTokens: c}}); err != nil {
			t.Fatal(err)
		}
	}
	rec("key_a", "m", 10, 5, "r1")
	rec("key_a", "m", 10, 5, "r1") // redelivered: once
	rec("key_a", "org/x|y", 1, 1, "r2")
	clock.add(time.Hour)
	rec("key_a", "m", 3, 3, "r3")
	rec("key_b", "m", 2, 0, "r4")
	clock.add(24 * time.Hour) // the next day's hash
	rec("key_a", "m", 1, 1, "r5")
	h := func(n int64, id, m string, req, p, c int64) registry.HourlyUsageRow {
		return registry.HourlyUsageRow{Hour: start.Unix() + n*3600, UsageRow: registry.UsageRow{KeyID: id, Model: m,
			Requests: req, PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}}
	}
	for _, tc := range []struct {
		name       string
		key, model string
		since      time.Time
		want       []registry.HourlyUsageRow
	}{
		{"all", "", "", start, []registry.HourlyUsageRow{h(0, "key_a", "m", 1, 10, 5), h(0, "key_a", "org/x|y", 1, 1, 1),
			h(1, "key_a", "m", 1, 3, 3), h(1, "key_b", "m", 1, 2, 0), h(25, "key_a", "m", 1, 1, 1)}},
		{"one key and model", "key_a", "m", start, []registry.HourlyUsageRow{h(0, "key_a", "m", 1, 10, 5),
			h(1, "key_a", "m", 1, 3, 3), h(25, "key_a", "m", 1, 1, 1)}},
		{"since an hour", "", "", start.Add(time.Hour + time.Minute), []registry.HourlyUsageRow{h(1, "key_a", "m", 1, 3, 3),
			h(1, "key_b", "m", 1, 2, 0), h(25, "key_a", "m", 1, 1, 1)}},
		{"nothing", "key_none", "", start, []registry.HourlyUsageRow{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.UsageHourly(ctx, tc.key, tc.model, tc.since, clock.now())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	// kept for UsageHourlyTTL, not for ever
	ttl, err := s.Client().PTTL(ctx, fmt.Sprintf("tokenbus:key:{key_a}:hourly:%d", start.Unix()/3600/24)).Result()
	if err != nil || ttl <= 0 || ttl > registry.UsageHourlyTTL {
		t.Fatalf("hourly hash TTL %v %v", ttl, err)
	}
}
