// Package registry is tokenbus's control-plane state in Redis: the models
// and LoRA adapters that exist. Gateways and dispatchers read it through a
// Cache, so serving known models goes on while Redis is down.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Model is a registered base model or LoRA adapter.
type Model struct {
	Name        string `json:"name"`
	Base        string `json:"base,omitempty"` // set for adapters: the base model
	Path        string `json:"path,omitempty"` // adapter weights: path or URI
	OwnedBy     string `json:"owned_by,omitempty"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	Created     int64  `json:"created"`
}

// IsAdapter reports whether m is a LoRA adapter.
func (m Model) IsAdapter() bool { return m.Base != "" }

// Store reads and writes the registry. Keys share the hash tag {tokenbus} so
// multi-key scripts work on Redis Cluster.
type Store struct {
	rdb redis.UniversalClient
}

const keyModels = "{tokenbus}:models" // hash: name -> Model JSON

// Open connects to the Redis at url (redis://[user:pass@]host:port/db or
// rediss:// for TLS) and checks it answers.
func Open(ctx context.Context, url string) (*Store, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	opts.ContextTimeoutEnabled = true
	opts.DialTimeout = 2 * time.Second
	opts.ReadTimeout = 2 * time.Second
	opts.WriteTimeout = 2 * time.Second
	opts.MaxRetries = 1
	rdb := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", opts.Addr, err)
	}
	return &Store{rdb: rdb}, nil
}

// NewStore wraps an existing client.
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// Client is the underlying Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Close closes the connection.
func (s *Store) Close() error { return s.rdb.Close() }

// ErrNotFound is returned for a model that is not registered.
var ErrNotFound = errors.New("not registered")

// PutModel creates or replaces a model.
func (s *Store) PutModel(ctx context.Context, m Model) error {
	if m.Created == 0 {
		m.Created = time.Now().Unix()
	}
	b, _ := json.Marshal(m)
	return s.rdb.HSet(ctx, keyModels, m.Name, b).Err()
}

// EnsureModel registers m unless a model of that name exists; it reports
// whether it created it.
func (s *Store) EnsureModel(ctx context.Context, m Model) (bool, error) {
	if m.Created == 0 {
		m.Created = time.Now().Unix()
	}
	b, _ := json.Marshal(m)
	return s.rdb.HSetNX(ctx, keyModels, m.Name, b).Result()
}

// DeleteModel removes a model; ErrNotFound if it was not there.
func (s *Store) DeleteModel(ctx context.Context, name string) error {
	n, err := s.rdb.HDel(ctx, keyModels, name).Result()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// Model returns one model.
func (s *Store) Model(ctx context.Context, name string) (Model, error) {
	b, err := s.rdb.HGet(ctx, keyModels, name).Bytes()
	if errors.Is(err, redis.Nil) {
		return Model{}, ErrNotFound
	}
	if err != nil {
		return Model{}, err
	}
	var m Model
	err = json.Unmarshal(b, &m)
	return m, err
}

// Models returns every model, sorted by name.
func (s *Store) Models(ctx context.Context) ([]Model, error) {
	all, err := s.rdb.HGetAll(ctx, keyModels).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Model, 0, len(all))
	for _, v := range all {
		var m Model
		if json.Unmarshal([]byte(v), &m) == nil {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Model) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out, nil
}
