package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/tokenbus/tokenbus/schemas"
)

// Quotas is what one tenant may keep in tokenbus's shared stores: the
// bytes and number of its files, its batches not yet ended, its stored
// responses, its background responses and resumable streams in progress.
// In a tenant's record a field of 0 takes the gateway's default (its
// --quota-* flag) and a negative one is no limit; in the defaults, and in
// what Resolve returns, 0 or less is no limit.
type Quotas struct {
	FileBytes       int64 `json:"file_bytes"`
	Files           int64 `json:"files"`
	Batches         int64 `json:"batches"`
	StoredResponses int64 `json:"stored_responses"`
	Background      int64 `json:"background"`
	Resumable       int64 `json:"resumable"`
}

// Resolve is the quotas that apply: q's own fields, its zero ones from
// defaults; a negative field (or a default of 0) is no limit, returned as 0.
func (q Quotas) Resolve(defaults Quotas) Quotas {
	pick := func(own, def int64) int64 {
		switch {
		case own > 0:
			return own
		case own < 0:
			return 0
		}
		return max(def, 0)
	}
	return Quotas{
		FileBytes:       pick(q.FileBytes, defaults.FileBytes),
		Files:           pick(q.Files, defaults.Files),
		Batches:         pick(q.Batches, defaults.Batches),
		StoredResponses: pick(q.StoredResponses, defaults.StoredResponses),
		Background:      pick(q.Background, defaults.Background),
		Resumable:       pick(q.Resumable, defaults.Resumable),
	}
}

// EventQuotas is the subject on which quota changes are announced (body:
// the tenant); every QuotaCache forgets that tenant's when one arrives.
const EventQuotas = schemas.EventsPrefix + "quotas"

// checkTenant: the rules a key's tenant follows (KeySpec.check).
func checkTenant(tenant string) error {
	switch {
	case tenant == "":
		return invalid(schemas.ErrMissingParam.At("tenant", "tenant"))
	case len(tenant) > maxNameLen:
		return invalid(schemas.ErrInvalidValue.At("tenant", "tenant", fmt.Sprintf("longer than %d bytes", maxNameLen)))
	}
	for _, r := range tenant {
		if unicode.IsControl(r) {
			return invalid(schemas.ErrInvalidValue.At("tenant", "tenant", "control characters are not allowed"))
		}
	}
	return nil
}

// TenantQuotas is tenant's own quotas record (all zero: the defaults).
func (s *Store) TenantQuotas(ctx context.Context, tenant string) (Quotas, error) {
	var b []byte
	err := s.br.Do(ctx, func(ctx context.Context) error {
		var err error
		b, err = s.rdb.HGet(ctx, keyQuotas, tenant).Bytes()
		if errors.Is(err, redis.Nil) {
			b, err = nil, nil
		}
		return storeErr(err)
	})
	if err != nil || b == nil {
		return Quotas{}, err
	}
	var q Quotas
	if err := json.Unmarshal(b, &q); err != nil {
		return Quotas{}, fmt.Errorf("quotas of %q: %w", tenant, err)
	}
	return q, nil
}

// SetTenantQuotas sets tenant's own quotas; all zero removes its record (it
// has the defaults). Callers announce it (AnnounceQuotas).
func (s *Store) SetTenantQuotas(ctx context.Context, tenant string, q Quotas) error {
	if err := checkTenant(tenant); err != nil {
		return err
	}
	if q == (Quotas{}) {
		return storeErr(s.rdb.HDel(ctx, keyQuotas, tenant).Err())
	}
	b, _ := json.Marshal(q)
	return storeErr(s.rdb.HSet(ctx, keyQuotas, tenant, b).Err())
}

// AllTenantQuotas is every tenant's own quotas record.
func (s *Store) AllTenantQuotas(ctx context.Context) (map[string]Quotas, error) {
	all, err := s.rdb.HGetAll(ctx, keyQuotas).Result()
	if err != nil {
		return nil, storeErr(err)
	}
	out := make(map[string]Quotas, len(all))
	for t, v := range all {
		var q Quotas
		if json.Unmarshal([]byte(v), &q) == nil {
			out[t] = q
		}
	}
	return out, nil
}

// Tenants is every tenant tokenbus knows of: those of the API keys and
// those with quotas of their own, sorted.
func (s *Store) Tenants(ctx context.Context) ([]string, error) {
	keys, err := s.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	qs, err := s.AllTenantQuotas(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, k := range keys {
		seen[k.Tenant] = true
	}
	for t := range qs {
		seen[t] = true
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	slices.SortFunc(out, strings.Compare)
	return out, nil
}

// AnnounceQuotas tells every QuotaCache that tenant's quotas changed. It
// flushes (for up to a second), so the event has left when it returns.
func AnnounceQuotas(nc *nats.Conn, tenant string) error {
	return announce(nc, EventQuotas, tenant)
}

// QuotaCache answers a tenant's quotas (its record resolved against the
// defaults) without a Redis round trip per request: each answer is held for
// a TTL, and an EventQuotas message drops it at once. While Redis is down,
// an answer it gave is served on, and a tenant never asked about gets the
// defaults: quotas bound the stores, and a Redis outage should not stop
// uploads. A nil store: the defaults for everyone.
type QuotaCache struct {
	store    *Store
	defaults Quotas
	ttl      time.Duration
	log      *slog.Logger
	flight   singleflight.Group

	mu  sync.Mutex
	gen uint64
	m   map[string]cachedQuotas
}

type cachedQuotas struct {
	q  Quotas // the tenant's own record
	at time.Time
}

// maxCachedQuotas bounds the tenants remembered.
const maxCachedQuotas = 10000

// NewQuotaCache makes a cache over store (nil: none) with these defaults;
// ttl <= 0 means 10 s.
func NewQuotaCache(store *Store, defaults Quotas, ttl time.Duration, log *slog.Logger) *QuotaCache {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &QuotaCache{store: store, defaults: defaults, ttl: ttl, log: log, m: map[string]cachedQuotas{}}
}

// Defaults is the quotas of a tenant without a record of its own.
func (c *QuotaCache) Defaults() Quotas {
	if c == nil {
		return Quotas{}
	}
	return c.defaults
}

// Lookup is tenant's quotas as they apply (Resolve): the function the
// stores that enforce them are handed.
func (c *QuotaCache) Lookup(ctx context.Context, tenant string) (Quotas, error) {
	own, err := c.Own(ctx, tenant)
	return own.Resolve(c.Defaults()), err
}

// Own is tenant's own record, cached. Its error is nil when Redis could
// not answer: then the last answer, or the defaults (all zero), stand.
func (c *QuotaCache) Own(ctx context.Context, tenant string) (Quotas, error) {
	if c == nil || c.store == nil {
		return Quotas{}, nil
	}
	now := time.Now()
	c.mu.Lock()
	hit, ok := c.m[tenant]
	gen := c.gen
	c.mu.Unlock()
	if ok && now.Sub(hit.at) < c.ttl {
		return hit.q, nil
	}
	v, err, _ := c.flight.Do(tenant, func() (any, error) { return c.store.TenantQuotas(ctx, tenant) })
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			c.log.Warn("Redis unavailable: a tenant's quotas are the last known, or the defaults", "tenant", tenant, "err", err)
			return hit.q, nil
		}
		return Quotas{}, err
	}
	q := v.(Quotas)
	if gen == c.gen {
		if len(c.m) >= maxCachedQuotas {
			clear(c.m)
		}
		c.m[tenant] = cachedQuotas{q: q, at: now}
	}
	return q, nil
}

// Forget drops what the cache holds of tenant.
func (c *QuotaCache) Forget(tenant string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, tenant)
}

// Purge forgets every tenant's quotas.
func (c *QuotaCache) Purge() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.m)
}

// Subscribe keeps the cache current from EventQuotas messages on nc, from
// the time it returns; the returned function stops that.
func (c *QuotaCache) Subscribe(nc *nats.Conn) (stop func(), err error) {
	return follow(nc, EventQuotas, c.Forget)
}
