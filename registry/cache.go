package registry

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

// EventModels is the subject on which model and adapter changes are announced.
const EventModels = schemas.EventsPrefix + "models"

// Cache keeps a copy of the registry, refreshed periodically and at once on
// a change event, so that reads never wait on Redis and survive its outage.
type Cache struct {
	store *Store
	log   *slog.Logger

	mu     sync.RWMutex
	models map[string]Model
	// up: the last refresh read Redis (false before the first): what the
	// process's tokenbus_redis_up reports.
	up atomic.Bool
}

// NewCache makes a cache; call Run to keep it fresh.
func NewCache(store *Store, log *slog.Logger) *Cache {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{store: store, log: log, models: map[string]Model{}}
}

// Refresh reloads the cache from Redis.
func (c *Cache) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	list, err := c.store.Models(ctx)
	c.up.Store(err == nil)
	if err != nil {
		return err
	}
	m := make(map[string]Model, len(list))
	for _, x := range list {
		m[x.Name] = x
	}
	c.mu.Lock()
	c.models = m
	c.mu.Unlock()
	return nil
}

// Run refreshes every interval and whenever a change event arrives on nc
// (nil: polling only), until ctx ends.
func (c *Cache) Run(ctx context.Context, nc *nats.Conn, every time.Duration) {
	kick := make(chan struct{}, 1)
	if nc != nil {
		sub, err := nc.Subscribe(EventModels, func(*nats.Msg) {
			select {
			case kick <- struct{}{}:
			default:
			}
		})
		if err == nil {
			defer sub.Unsubscribe()
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("registry refresh failed; serving from cache", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
	}
}

// Known reports whether model is registered.
func (c *Cache) Known(model string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.models[model]
	return ok
}

// Models lists the registered models and adapters, sorted by name.
func (c *Cache) Models() []Model {
	c.mu.RLock()
	out := make([]Model, 0, len(c.models))
	for _, m := range c.models {
		out = append(out, m)
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Up reports whether the last refresh read Redis: false before the first,
// and from a failed refresh until the next one that succeeds (Run refreshes
// every interval, so an outage shows within one).
func (c *Cache) Up() bool { return c.up.Load() }

// Get returns a registered model.
func (c *Cache) Get(model string) (Model, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.models[model]
	return m, ok
}

// Announce tells every cache that the registry changed. It flushes (for up
// to a second), so the event has left when it returns.
func Announce(nc *nats.Conn, name string) error {
	return announce(nc, EventModels, name)
}

// follow calls fn with the body of every message on subject, from the time
// it returns (the subscription is flushed to the server); stop ends that.
func follow(nc *nats.Conn, subject string, fn func(body string)) (stop func(), err error) {
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { fn(string(m.Data)) })
	if err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// announce publishes body on subject and flushes for up to a second.
func announce(nc *nats.Conn, subject, body string) error {
	if err := nc.Publish(subject, []byte(body)); err != nil {
		return err
	}
	return nc.FlushTimeout(time.Second)
}
