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

// Revocations tells work queued under an API key (a batch's lines, a
// background response's steps) whether the key has been deleted since, so
// that a deleted key's work stops before its next step rather than run to
// the end billed to it. Its Revoked fits the runners' KeyRevoked hooks.
//
// A step costs no Redis round trip: an answer is held for a TTL, and an
// EventKeys message naming the key (the admin API's delete sends one) makes
// the next question ask Redis at once. Key ids are never reused, so a key
// Redis said is gone stays revoked for good, whatever happens to Redis
// later.
//
// While Redis cannot answer, Revoked fails open for a key it has no news of
// (it says "not revoked": the work goes on, as the key itself keeps working
// on the OpenAI API from the key cache), and closed for a key an EventKeys
// message named since Redis last confirmed it. Why: what a runner does with
// "revoked" cannot be undone (a batch is cancelled), so a Redis outage must
// not cancel every tenant's work; and a deletion itself needs Redis and
// announces itself, so every gateway connected to NATS at the time knows of
// it. What fails open is only a gateway that missed the event (it was not
// connected) and then cannot ask: its work goes on until Redis answers.
type Revocations struct {
	store *Store
	ttl   time.Duration
	log   *slog.Logger

	// flight makes concurrent questions about one key one Redis call.
	flight singleflight.Group

	mu      sync.Mutex
	checked map[string]time.Time // key id -> when Redis was last asked about it (and said it exists, or did not answer)
	gone    map[string]struct{}  // key ids Redis said do not exist
	changed map[string]struct{}  // key ids an EventKeys message named since Redis last answered for them
}

// maxRevocations bounds each of Revocations' maps (a key id is ~30 bytes).
const maxRevocations = 100_000

// revokedTimeout bounds one Redis question of Revoked (the store's breaker,
// if any, bounds it further).
const revokedTimeout = 2 * time.Second

// NewRevocations makes the lookup over store; ttl <= 0 means 10 s (the key
// cache's default).
func NewRevocations(store *Store, ttl time.Duration, log *slog.Logger) *Revocations {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Revocations{store: store, ttl: ttl, log: log, checked: map[string]time.Time{},
		gone: map[string]struct{}{}, changed: map[string]struct{}{}}
}

// Revoked reports whether API key keyID has been deleted. "" (no key:
// --auth off) is never revoked.
func (r *Revocations) Revoked(ctx context.Context, keyID string) bool {
	if keyID == "" {
		return false
	}
	now := time.Now()
	r.mu.Lock()
	if _, ok := r.gone[keyID]; ok {
		r.mu.Unlock()
		return true
	}
	if at, ok := r.checked[keyID]; ok && now.Sub(at) < r.ttl {
		// Asked within the TTL: it existed, or Redis did not answer (then
		// an event since the last answer makes it revoked meanwhile).
		_, changed := r.changed[keyID]
		r.mu.Unlock()
		return changed
	}
	r.mu.Unlock()

	_, err, _ := r.flight.Do(keyID, func() (any, error) {
		// Not the caller's context: a runner stopping is no answer about
		// the key, and the call is shared.
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), revokedTimeout)
		defer cancel()
		return nil, r.store.br.Do(qctx, func(ctx context.Context) error {
			_, err := r.store.Key(ctx, keyID)
			return err
		})
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		delete(r.changed, keyID)
		bounded(r.checked)
		r.checked[keyID] = now
		return false
	case errors.Is(err, ErrNotFound):
		delete(r.changed, keyID)
		delete(r.checked, keyID)
		bounded(r.gone)
		r.gone[keyID] = struct{}{}
		return true
	}
	// Not asked again for a TTL: every step would wait on the dead Redis.
	bounded(r.checked)
	r.checked[keyID] = now
	_, changed := r.changed[keyID]
	r.log.Warn("Redis cannot say whether an API key still exists", "key_id", keyID, "err", err,
		"treated_as_revoked", changed)
	return changed
}

// bounded makes room in m for one more entry: past maxRevocations it is
// emptied (its answers are then asked again; a gone key asked while Redis
// is down is taken as alive: a hundred thousand deleted keys with work
// still queued is not a case to design for).
func bounded[V any](m map[string]V) {
	if len(m) >= maxRevocations {
		clear(m)
	}
}

// changedKey takes an EventKeys message: the key it names is asked about
// at its next question, and is taken as revoked until Redis answers. An
// empty body names no key: every key is asked about again, none suspected.
func (r *Revocations) changedKey(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id == "" {
		clear(r.checked)
		return
	}
	delete(r.checked, id)
	bounded(r.changed)
	r.changed[id] = struct{}{}
}

// Subscribe follows EventKeys on nc from the time it returns; the returned
// function stops that.
func (r *Revocations) Subscribe(nc *nats.Conn) (stop func(), err error) {
	return follow(nc, EventKeys, r.changedKey)
}
