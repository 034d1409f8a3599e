package registry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/singleflight"
)

// KeyCache looks API keys up by secret for gateways, holding each answer for
// a short TTL so that a request costs no Redis round trip. Any message on
// EventKeys empties it, so a deleted key stops working as soon as the event
// arrives (and within the TTL if the event is lost). While Redis is down,
// keys it has seen keep working past the TTL, for up to MaxStale after
// Redis last confirmed them, and other secrets get ErrUnavailable (a 503),
// not ErrNotFound: the cache cannot tell a new key from a bad one.
type KeyCache struct {
	store *Store
	ttl   time.Duration
	log   *slog.Logger
	// MaxStale bounds how long after Redis last confirmed a key it is served
	// while Redis is down (a key deleted meanwhile whose event was lost works
	// that long). Default (0) 1h; set it before use.
	MaxStale time.Duration

	// flight makes concurrent misses for one entry one Redis call: a burst
	// of requests with a key not yet cached would otherwise each ask Redis,
	// each within the breaker's short wait.
	flight singleflight.Group

	mu  sync.Mutex
	gen uint64 // bumped by Purge, so a lookup racing with it does not store a stale answer
	pos map[string]cachedKey
	neg map[string]time.Time // secrets' hashes known not to be keys, and when
}

type cachedKey struct {
	key       Key
	at        time.Time // when it was last looked up (or served stale)
	confirmed time.Time // when Redis last said so
}

// maxNegative bounds the unknown secrets remembered, against floods of bad keys.
const maxNegative = 10000

// NewKeyCache makes a cache over store; ttl <= 0 means 10 s.
func NewKeyCache(store *Store, ttl time.Duration, log *slog.Logger) *KeyCache {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &KeyCache{store: store, ttl: ttl, log: log, pos: map[string]cachedKey{}, neg: map[string]time.Time{}}
}

// Lookup returns the key whose secret this is: ErrNotFound if none,
// ErrUnavailable if Redis cannot say.
func (c *KeyCache) Lookup(ctx context.Context, secret string) (Key, error) {
	hash := HashSecret(secret)
	return c.lookup(ctx, hash, func(ctx context.Context) (Key, error) { return c.store.KeyByHash(ctx, hash) })
}

// Key returns the key with this id, cached as Lookup caches secrets: for a
// dispatcher admitting NATS-native tenant requests, whose subject names
// the key id (dispatcher.Keys).
func (c *KeyCache) Key(ctx context.Context, id string) (Key, error) {
	// "id:" cannot collide with a secret's hash (hex).
	return c.lookup(ctx, "id:"+id, func(ctx context.Context) (Key, error) { return c.store.Key(ctx, id) })
}

func (c *KeyCache) lookup(ctx context.Context, entry string, fetch func(context.Context) (Key, error)) (Key, error) {
	now := time.Now()
	c.mu.Lock()
	hit, known := c.pos[entry]
	if known && now.Sub(hit.at) < c.ttl {
		c.mu.Unlock()
		return hit.key, nil
	}
	if at, ok := c.neg[entry]; ok && now.Sub(at) < c.ttl {
		c.mu.Unlock()
		return Key{}, keyNotFound("")
	}
	gen := c.gen
	c.mu.Unlock()

	v, err, _ := c.flight.Do(entry, func() (any, error) { return fetch(ctx) })
	k, _ := v.(Key)
	c.mu.Lock()
	defer c.mu.Unlock()
	current := gen == c.gen
	switch {
	case err == nil:
		if current {
			c.pos[entry] = cachedKey{key: k, at: now, confirmed: now}
			delete(c.neg, entry)
		}
		return k, nil
	case errors.Is(err, ErrNotFound):
		if current {
			delete(c.pos, entry)
			if len(c.neg) >= maxNegative {
				clear(c.neg)
			}
			c.neg[entry] = now
		}
		return Key{}, err
	case errors.Is(err, ErrUnavailable) && known && current && now.Sub(hit.confirmed) < c.maxStale():
		// Serve the key we know, and do not ask again for a TTL: every
		// request would otherwise wait on the dead Redis.
		c.log.Warn("Redis unavailable: serving a cached API key", "key_id", hit.key.ID, "err", err)
		c.pos[entry] = cachedKey{key: hit.key, at: now, confirmed: hit.confirmed}
		return hit.key, nil
	}
	return Key{}, err
}

func (c *KeyCache) maxStale() time.Duration {
	if c.MaxStale <= 0 {
		return time.Hour
	}
	return c.MaxStale
}

// Purge forgets every cached answer.
func (c *KeyCache) Purge() {
	c.mu.Lock()
	c.gen++
	clear(c.pos)
	clear(c.neg)
	c.mu.Unlock()
}

// Subscribe purges the cache on every EventKeys message on nc, from the time
// it returns; the returned function stops that.
func (c *KeyCache) Subscribe(nc *nats.Conn) (stop func(), err error) {
	return follow(nc, EventKeys, func(string) { c.Purge() })
}

// Peek returns the key whose secret this is if the cache holds it, looked up
// within maxAge, without asking Redis: a map lookup on the secret's SHA-256,
// whose time does not depend on the secret. Throttled clients are answered
// from it only (gateway/throttle.go).
func (c *KeyCache) Peek(secret string, maxAge time.Duration) (Key, bool) {
	hash := HashSecret(secret)
	c.mu.Lock()
	defer c.mu.Unlock()
	hit, ok := c.pos[hash]
	if !ok || time.Since(hit.at) >= maxAge {
		return Key{}, false
	}
	return hit.key, true
}
