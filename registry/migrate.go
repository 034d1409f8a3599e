package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The layout before Cluster support: every key under the one hash tag
// {tokenbus}, so all of it is in one slot, on one node (docs/redis.md,
// "Migrating").
const (
	oldModels     = "{tokenbus}:models"     // hash: name -> Model JSON
	oldQuotas     = "{tokenbus}:quotas"     // hash: tenant -> Quotas JSON
	oldKeys       = "{tokenbus}:keys"       // hash: key id -> keyRecord JSON
	oldUsageIndex = "{tokenbus}:usage:keys" // set: key ids with usage
)

func oldRate(id string) string  { return "{tokenbus}:rl:" + id }
func oldUsage(id string) string { return "{tokenbus}:usage:" + id }

// The old layout's hourly hashes, {tokenbus}:usage:hourly:<key id>:<day>,
// and sets of recorded request ids, {tokenbus}:usage:seen:<period>, are
// found with SCAN: they all live on the one node that holds the slot.
const (
	oldHourlyPrefix = "{tokenbus}:usage:hourly:"
	oldSeenPrefix   = "{tokenbus}:usage:seen:"
)

// OldLayout reports whether the Redis holds data of the layout before
// Cluster support that the current layout does not: models or API keys
// under {tokenbus} and none under tokenbus:. A gateway logs it at start:
// such data wants `tokenbus redis migrate`.
func (s *Store) OldLayout(ctx context.Context) (bool, error) {
	// One slot: a multi-key EXISTS is allowed on a Cluster.
	old, err := s.rdb.Exists(ctx, oldModels, oldKeys).Result()
	if err != nil || old == 0 {
		return false, storeErr(err)
	}
	keys, err := s.rdb.Exists(ctx, keyIndex).Result()
	if err != nil {
		return false, storeErr(err)
	}
	models, err := s.rdb.Exists(ctx, keyModels).Result()
	return keys+models == 0, storeErr(err)
}

// Migrated is what Migrate copied.
type Migrated struct {
	Models, Keys, Quotas, RateWindows, UsageKeys, HourlyHashes, SeenIDs int
}

func (m Migrated) String() string {
	return fmt.Sprintf("%d models, %d API keys, %d tenants' quotas, %d rate-limit windows, usage of %d keys (%d hourly hashes), %d recent request ids",
		m.Models, m.Keys, m.Quotas, m.RateWindows, m.UsageKeys, m.HourlyHashes, m.SeenIDs)
}

// Migrate copies the registry from from, a Redis in the layout before
// Cluster support (any node that holds the {tokenbus} slot), into to's
// layout: models, quotas, API keys (still found by their secrets), their
// current rate-limit windows, usage with its hourly view and the request ids
// of the last UsageSeenTTL (so that a usage record delivered again after the
// move still counts once). An admission kept for Readmit is not copied
// (a request retried across the move counts as a new one).
//
// It reads from and never writes to from, and it writes absolute values
// (HSET, SET, SADD), so running it again copies the same again: run it
// while no gateway writes to to (before the upgraded gateways start), since
// a second run sets usage counters back to the old layout's values. from
// and to may be the same Redis: the layouts' key names differ.
func Migrate(ctx context.Context, from redis.UniversalClient, to *Store) (Migrated, error) {
	var m Migrated
	// Models and quotas: one hash each, copied whole.
	for _, h := range []struct {
		from, to string
		n        *int
	}{{oldModels, keyModels, &m.Models}, {oldQuotas, keyQuotas, &m.Quotas}} {
		all, err := from.HGetAll(ctx, h.from).Result()
		if err != nil {
			return m, fmt.Errorf("read %s: %w", h.from, err)
		}
		if len(all) == 0 {
			continue
		}
		if err := to.rdb.HSet(ctx, h.to, all).Err(); err != nil {
			return m, fmt.Errorf("write %s: %w", h.to, storeErr(err))
		}
		*h.n = len(all)
	}
	// API keys: each as CreateKey writes it, with its window.
	keys, err := from.HGetAll(ctx, oldKeys).Result()
	if err != nil {
		return m, fmt.Errorf("read %s: %w", oldKeys, err)
	}
	for id, raw := range keys {
		var rec keyRecord
		if err := json.Unmarshal([]byte(raw), &rec); err != nil || rec.Hash == "" {
			return m, fmt.Errorf("API key %s in %s: not a key record (%v)", id, oldKeys, err)
		}
		writes := []slotWrite{
			{keyIndex, func(ctx context.Context, c redis.Cmdable) error {
				return indexScript.Run(ctx, c, []string{keyIndex}, id).Err()
			}},
			{secretKey(rec.Hash), func(ctx context.Context, c redis.Cmdable) error {
				return c.Set(ctx, secretKey(rec.Hash), id, 0).Err()
			}},
			{recordKey(id), func(ctx context.Context, c redis.Cmdable) error { return c.Set(ctx, recordKey(id), raw, 0).Err() }},
		}
		win, ttl, err := hashWithTTL(ctx, from, oldRate(id))
		if err != nil {
			return m, err
		}
		if len(win) > 0 {
			writes = append(writes, slotWrite{rateKey(id), func(ctx context.Context, c redis.Cmdable) error {
				return setHash(ctx, c, rateKey(id), win, ttl)
			}})
			m.RateWindows++
		}
		if err := to.writeDurably(ctx, writes...); err != nil {
			return m, fmt.Errorf("write API key %s: %w", id, err)
		}
		m.Keys++
	}
	// Usage: the index, then each key's hashes.
	ids, err := from.SMembers(ctx, oldUsageIndex).Result()
	if err != nil {
		return m, fmt.Errorf("read %s: %w", oldUsageIndex, err)
	}
	// The hourly hashes, by key id: one SCAN (an id is what comes before
	// the last ':', the day after it).
	hourly, err := scanKeys(ctx, from, oldHourlyPrefix+"*")
	if err != nil {
		return m, err
	}
	type oldDay struct {
		key string
		day int64
	}
	daysOf := map[string][]oldDay{}
	for _, old := range hourly {
		id, d, ok := cutLast(strings.TrimPrefix(old, oldHourlyPrefix), ":")
		if !ok {
			continue
		}
		day, err := strconv.ParseInt(d, 10, 64)
		if err != nil {
			continue
		}
		daysOf[id] = append(daysOf[id], oldDay{old, day})
	}
	for _, id := range ids {
		writes := []slotWrite{{keyUsageIndex, func(ctx context.Context, c redis.Cmdable) error {
			return indexScript.Run(ctx, c, []string{keyUsageIndex}, id).Err()
		}}}
		usage, err := from.HGetAll(ctx, oldUsage(id)).Result()
		if err != nil {
			return m, fmt.Errorf("read %s: %w", oldUsage(id), err)
		}
		if len(usage) > 0 {
			writes = append(writes, slotWrite{usageKey(id), func(ctx context.Context, c redis.Cmdable) error {
				return c.HSet(ctx, usageKey(id), usage).Err()
			}})
		}
		for _, d := range daysOf[id] {
			h, ttl, err := hashWithTTL(ctx, from, d.key)
			if err != nil {
				return m, err
			}
			if len(h) == 0 {
				continue
			}
			key := hourlyKey(id, d.day)
			writes = append(writes, slotWrite{key, func(ctx context.Context, c redis.Cmdable) error {
				return setHash(ctx, c, key, h, ttl)
			}})
			m.HourlyHashes++
		}
		if err := to.writeDurably(ctx, writes...); err != nil {
			return m, fmt.Errorf("write the usage of %s: %w", id, err)
		}
		m.UsageKeys++
	}
	// The request ids recorded lately (the sets not yet expired), to the
	// sets of their keys (a member is "<key id>:<request id>"; key ids have
	// no ':').
	sets, err := scanKeys(ctx, from, oldSeenPrefix+"*")
	if err != nil {
		return m, err
	}
	for _, set := range sets {
		p, err := strconv.ParseInt(strings.TrimPrefix(set, oldSeenPrefix), 10, 64)
		if err != nil {
			continue
		}
		members, err := from.SMembers(ctx, set).Result()
		if err != nil {
			return m, fmt.Errorf("read %s: %w", set, err)
		}
		ttl, err := from.PTTL(ctx, set).Result()
		if err != nil {
			return m, fmt.Errorf("read %s: %w", set, err)
		}
		byKey := map[string][]any{}
		for _, mem := range members {
			if id, req, ok := strings.Cut(mem, ":"); ok {
				byKey[id] = append(byKey[id], req)
			}
		}
		for id, reqs := range byKey {
			key := seenSet(id, p)
			err := to.writeDurably(ctx, slotWrite{key, func(ctx context.Context, c redis.Cmdable) error {
				if err := c.SAdd(ctx, key, reqs...).Err(); err != nil {
					return err
				}
				return c.PExpire(ctx, key, max(ttl, time.Second)).Err()
			}})
			if err != nil {
				return m, fmt.Errorf("write %s: %w", key, err)
			}
			m.SeenIDs += len(reqs)
		}
	}
	return m, nil
}

// cutLast is strings.Cut at the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// scanKeys is every key matching pattern, by SCAN.
func scanKeys(ctx context.Context, c redis.UniversalClient, pattern string) ([]string, error) {
	var out []string
	it := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for it.Next(ctx) {
		out = append(out, it.Val())
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("scan %s: %w", pattern, err)
	}
	return out, nil
}

// hashWithTTL reads a hash and its time to live (0: none).
func hashWithTTL(ctx context.Context, c redis.UniversalClient, key string) (map[string]string, time.Duration, error) {
	h, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", key, err)
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("read %s: %w", key, err)
	}
	return h, max(ttl, 0), nil
}

// setHash writes h to key with a lifetime of ttl (0: none), in one MULTI.
func setHash(ctx context.Context, c redis.Cmdable, key string, h map[string]string, ttl time.Duration) error {
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, h)
		if ttl > 0 {
			p.PExpire(ctx, key, ttl)
		}
		return nil
	})
	return err
}
