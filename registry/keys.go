package registry

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/schemas"
)

// EventKeys is the subject on which API key changes are announced; every
// KeyCache drops what it holds when one arrives.
const EventKeys = schemas.EventsPrefix + "keys"

// SecretPrefix starts every API key secret, so a gateway can reject strings
// that are no key at all without asking Redis.
const SecretPrefix = "tb-"

// An API key is its record, recordKey(id), found by its secret through
// secretKey(hash) and listed in keyIndex (layout.go). Secrets are never
// stored: only their SHA-256. The three live in different slots: a key is
// created index, secret entry, record (the record last: the key exists once
// it is written) and deleted record first, and a lookup by secret or a
// listing checks the record, so a step cut short shows nothing half made.

// KeySpec is what an API key is created with.
type KeySpec struct {
	Name   string   `json:"name"`
	Tenant string   `json:"tenant"`
	Models []string `json:"models"` // models it may use; empty: all
	RPM    int      `json:"rpm"`    // requests per minute; 0: no limit
	TPM    int      `json:"tpm"`    // tokens (prompt + completion) per minute; 0: no limit
	// Flow control (docs/scheduling.md): the priority band of the key's
	// requests ("critical", "interactive" or "batch"; "" is interactive),
	// its tenant's weight in that band (1..1000; 0 is 1), and the longest a
	// request may wait in a dispatcher's queue (ms; 0: the dispatcher's
	// queue timeout). Give a tenant's keys the same weight: the weight is
	// the flow's, and the latest request's wins.
	Band       string `json:"band,omitempty"`
	Weight     int    `json:"weight,omitempty"`
	MaxQueueMS int64  `json:"max_queue_ms,omitempty"`
}

// FlowBand is the key's band (BandDefault when it names none).
func (k Key) FlowBand() schemas.Band {
	b, _ := schemas.ParseBand(k.Band)
	return b
}

// Key is an API key's record. It never holds the secret.
type Key struct {
	ID string `json:"id"`
	KeySpec
	Hint    string `json:"redacted_key"` // "tb-...abcd": enough to tell keys apart
	Hash    string `json:"-"`            // hex SHA-256 of the secret
	Created int64  `json:"created"`
}

// keyRecord is Key as stored: with its hash, which DeleteKey needs.
type keyRecord struct {
	Key
	Hash string `json:"hash"`
}

// Allows reports whether the key may use model: exact names, empty list = all.
func (k Key) Allows(model string) bool {
	return len(k.Models) == 0 || slices.Contains(k.Models, model)
}

// Limited reports whether the key has a rate limit.
func (k Key) Limited() bool { return k.RPM > 0 || k.TPM > 0 }

// HashSecret is the stored form of a secret: hex SHA-256. The secret is 256
// random bits, so a plain fast hash is enough (no password-style stretching).
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func (spec *KeySpec) check() error {
	if len(spec.Name) > maxNameLen {
		return invalid(schemas.ErrInvalidValue.At("name", "name", fmt.Sprintf("longer than %d bytes", maxNameLen)))
	}
	switch {
	case spec.Tenant == "":
		return invalid(schemas.ErrMissingParam.At("tenant", "tenant"))
	case len(spec.Tenant) > maxNameLen:
		return invalid(schemas.ErrInvalidValue.At("tenant", "tenant", fmt.Sprintf("longer than %d bytes", maxNameLen)))
	case spec.RPM < 0:
		return invalid(schemas.ErrInvalidValue.At("rpm", "rpm", "must not be negative (0 means no limit)"))
	case spec.TPM < 0:
		return invalid(schemas.ErrInvalidValue.At("tpm", "tpm", "must not be negative (0 means no limit)"))
	case spec.Weight < 0 || spec.Weight > schemas.MaxWeight:
		return invalid(schemas.ErrInvalidValue.At("weight", "weight", fmt.Sprintf("must be 1..%d (0 means 1)", schemas.MaxWeight)))
	case spec.MaxQueueMS < 0:
		return invalid(schemas.ErrInvalidValue.At("max_queue_ms", "max_queue_ms", "must not be negative (0 means the dispatcher's queue timeout)"))
	}
	if _, ok := schemas.ParseBand(spec.Band); !ok {
		return invalid(schemas.ErrInvalidValue.At("band", "band", "must be one of "+strings.Join(schemas.BandNames(), ", ")))
	}
	// The tenant travels as a NATS header value.
	for _, r := range spec.Tenant {
		if unicode.IsControl(r) {
			return invalid(schemas.ErrInvalidValue.At("tenant", "tenant", "control characters are not allowed"))
		}
	}
	for _, m := range spec.Models {
		if err := checkName("models", m); err != nil {
			return err
		}
	}
	return nil
}

// CreateKey makes an API key and returns its record and its secret, which
// exists only in this return value: Redis keeps its SHA-256.
func (s *Store) CreateKey(ctx context.Context, spec KeySpec) (Key, string, error) {
	if err := spec.check(); err != nil {
		return Key{}, "", err
	}
	if spec.Models == nil {
		spec.Models = []string{}
	}
	buf := make([]byte, 32+12)
	_, _ = rand.Read(buf) // crypto/rand.Read never fails
	secret := SecretPrefix + base64.RawURLEncoding.EncodeToString(buf[:32])
	k := Key{
		ID:      "key_" + hex.EncodeToString(buf[32:]),
		KeySpec: spec,
		Hint:    SecretPrefix + "..." + secret[len(secret)-4:],
		Hash:    HashSecret(secret),
		Created: time.Now().Unix(),
	}
	b, _ := json.Marshal(keyRecord{Key: k, Hash: k.Hash})
	// Each write waits for the replicas (Topology.MinReplicas): a key whose
	// secret was handed out must not vanish with a master.
	err := s.writeDurably(ctx,
		slotWrite{keyIndex, func(ctx context.Context, c redis.Cmdable) error {
			return storeErr(c.SAdd(ctx, keyIndex, k.ID).Err())
		}},
		slotWrite{secretKey(k.Hash), func(ctx context.Context, c redis.Cmdable) error {
			return storeErr(c.Set(ctx, secretKey(k.Hash), k.ID, 0).Err())
		}},
		slotWrite{recordKey(k.ID), func(ctx context.Context, c redis.Cmdable) error {
			return storeErr(c.Set(ctx, recordKey(k.ID), b, 0).Err())
		}})
	if err != nil {
		return Key{}, "", err
	}
	return k, secret, nil
}

// KeyByHash returns the key whose secret hashes to hash; ErrNotFound if none.
// It is two reads, in one breaker call: the secret's entry, then the record
// it names, which must name the same hash (an entry a crash or a deletion
// left behind finds no record, or another key's).
func (s *Store) KeyByHash(ctx context.Context, hash string) (Key, error) {
	var k Key
	err := s.br.Do(ctx, func(ctx context.Context) error {
		id, err := s.rdb.Get(ctx, secretKey(hash)).Result()
		if errors.Is(err, redis.Nil) {
			return keyNotFound("")
		}
		if err != nil {
			return storeErr(err)
		}
		k, err = s.readKey(ctx, s.rdb, id)
		if errors.Is(err, ErrNotFound) || err == nil && k.Hash != hash {
			return keyNotFound("")
		}
		return err
	})
	if err != nil {
		return Key{}, err
	}
	return k, nil
}

// Key returns a key by id; ErrNotFound if none.
func (s *Store) Key(ctx context.Context, id string) (Key, error) {
	return s.readKey(ctx, s.rdb, id)
}

// readKey reads key id's record with c; ErrNotFound if there is none.
func (s *Store) readKey(ctx context.Context, c redis.Cmdable, id string) (Key, error) {
	b, err := c.Get(ctx, recordKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return Key{}, keyNotFound(id)
	}
	if err != nil {
		return Key{}, storeErr(err)
	}
	return decodeKey(b)
}

func decodeKey(b []byte) (Key, error) {
	var r keyRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Key{}, err
	}
	r.Key.Hash = r.Hash
	return r.Key, nil
}

// ListKeys returns every key, oldest first (by creation second, then id):
// the index, then the records, pipelined (on a Cluster each node gets its
// part). An id without a record is skipped.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	ids, err := s.rdb.SMembers(ctx, keyIndex).Result()
	if err != nil {
		return nil, storeErr(err)
	}
	cmds := make([]*redis.StringCmd, len(ids))
	if len(ids) > 0 {
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.Get(ctx, recordKey(id))
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, storeErr(err)
		}
	}
	// Pipelined said the first error only: a missing record (an index
	// entry a deletion left) must not hide another's failure, which would
	// make the list short.
	out := make([]Key, 0, len(ids))
	for _, c := range cmds {
		b, err := c.Bytes()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, storeErr(err)
		}
		if k, err := decodeKey(b); err == nil {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.Created, b.Created), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// FlowPolicy is what PATCH /keys/{id} may change of a key: its flow
// control fields (nil: unchanged).
type FlowPolicy struct {
	Band       *string `json:"band"`
	Weight     *int    `json:"weight"`
	MaxQueueMS *int64  `json:"max_queue_ms"`
}

// SetKeyFlow changes a key's flow control fields and returns the key.
// ErrNotFound if there is no such key. Callers announce it (AnnounceKeys)
// so that gateways and dispatchers drop their cached copy.
func (s *Store) SetKeyFlow(ctx context.Context, id string, p FlowPolicy) (Key, error) {
	var out Key
	err := s.update(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		k, err := s.readKey(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		if p.Band != nil {
			k.Band = *p.Band
		}
		if p.Weight != nil {
			k.Weight = *p.Weight
		}
		if p.MaxQueueMS != nil {
			k.MaxQueueMS = *p.MaxQueueMS
		}
		if err := k.KeySpec.check(); err != nil {
			return nil, err
		}
		out = k
		rec, _ := json.Marshal(keyRecord{Key: k, Hash: k.Hash})
		return func(p redis.Pipeliner) { p.Set(ctx, recordKey(id), rec, 0) }, nil
	}, recordKey(id))
	return out, err
}

// deleteKeyScript: KEYS[1] the key's record, KEYS[2] its rate window (one
// slot). Deletes both and returns the record, or nil if there was none.
var deleteKeyScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
redis.call('DEL', KEYS[1], KEYS[2])
return v
`)

// DeleteKey deletes a key and its rate-limit window in one step, then its
// secret's entry and its index entry; its usage stays. ErrNotFound if there
// is no such key. The record goes first: from then on no lookup finds the
// key, whatever becomes of the rest (a deletion cut short leaves entries
// that point to nothing, which readers skip, and DeleteKey again cannot
// find the key to finish: they cost a few bytes). Callers announce it
// (AnnounceKeys) so that gateways forget it at once.
//
// ErrNotReplicated means the master deleted the key and its replicas did
// not confirm it in time: the rest is cleared all the same (a DeleteKey
// again finds no key: ErrNotFound), and callers announce it as a deletion.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	var rec string
	err := s.writeDurably(ctx, slotWrite{recordKey(id), func(ctx context.Context, c redis.Cmdable) error {
		var err error
		rec, err = deleteKeyScript.Run(ctx, c, []string{recordKey(id), rateKey(id)}).Text()
		if errors.Is(err, redis.Nil) {
			return keyNotFound(id)
		}
		return storeErr(err)
	}})
	if err != nil && (rec == "" || !errors.Is(err, ErrNotReplicated)) {
		return err
	}
	notReplicated := err
	k, err := decodeKey([]byte(rec))
	var cleanup []slotWrite
	if err == nil && k.Hash != "" {
		cleanup = append(cleanup, slotWrite{secretKey(k.Hash), func(ctx context.Context, c redis.Cmdable) error {
			return storeErr(c.Del(ctx, secretKey(k.Hash)).Err())
		}})
	}
	cleanup = append(cleanup, slotWrite{keyIndex, func(ctx context.Context, c redis.Cmdable) error {
		return storeErr(c.SRem(ctx, keyIndex, id).Err())
	}})
	// The key is gone: entries left over are skipped by every reader, so a
	// failure here is no failure of the deletion.
	_ = s.writeDurably(ctx, cleanup...)
	return notReplicated
}

// AnnounceKeys tells every KeyCache that keys changed (body: the key id).
// It flushes (for up to a second), so the event has left when it returns.
func AnnounceKeys(nc *nats.Conn, id string) error {
	return announce(nc, EventKeys, id)
}
