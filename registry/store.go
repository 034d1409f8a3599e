package registry

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
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

// Store reads and writes the registry. Its keys are laid out for Redis
// Cluster (keys.go's layout, docs/redis.md): what one script or transaction
// touches shares a hash tag, and nothing spans tags in one command.
type Store struct {
	rdb redis.UniversalClient
	// br guards the calls on a request's path (KeyByHash, Limiter's Admit
	// and Record); nil: none. Set by UseBreaker before use.
	br *Breaker
	// replicas is how many replicas a durable write waits for (WAIT), and
	// replicaWait how long at most (Topology.MinReplicas).
	replicas    int
	replicaWait time.Duration
}

// UseBreaker puts the calls on a request's path (key lookups, limit checks,
// usage writes) behind b. Call it before the store is used.
func (s *Store) UseBreaker(b *Breaker) { s.br = b }

// Breaker is the store's breaker (nil: none).
func (s *Store) Breaker() *Breaker { return s.br }

// Open connects to the single Redis node at url (redis://[user:pass@]host:
// port/db or rediss:// for TLS) and checks it answers: OpenTopology with
// just a URL.
func Open(ctx context.Context, url string) (*Store, error) {
	return OpenTopology(ctx, Topology{URL: url})
}

// NewStore wraps an existing client; its writes wait for no replica.
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// Client is the underlying Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Close closes the connection.
func (s *Store) Close() error { return s.rdb.Close() }

// PutModel creates or replaces a model as it is, without the checks of
// PutBase and PutAdapter (for tests and tools).
func (s *Store) PutModel(ctx context.Context, m Model) error {
	if m.Created == 0 {
		m.Created = time.Now().Unix()
	}
	b, _ := json.Marshal(m)
	return storeErr(s.rdb.HSet(ctx, keyModels, m.Name, b).Err())
}

// EnsureModel registers m unless a model of that name exists; it reports
// whether it created it.
func (s *Store) EnsureModel(ctx context.Context, m Model) (bool, error) {
	if m.Created == 0 {
		m.Created = time.Now().Unix()
	}
	b, _ := json.Marshal(m)
	ok, err := s.rdb.HSetNX(ctx, keyModels, m.Name, b).Result()
	return ok, storeErr(err)
}

// DeleteModel removes a model; ErrNotFound if it was not there, ErrConflict
// if it is a base model with adapters (RemoveModel can force that).
func (s *Store) DeleteModel(ctx context.Context, name string) error {
	_, err := s.RemoveModel(ctx, name, false)
	return err
}

// Model returns one model.
func (s *Store) Model(ctx context.Context, name string) (Model, error) {
	b, err := s.rdb.HGet(ctx, keyModels, name).Bytes()
	if errors.Is(err, redis.Nil) {
		return Model{}, modelNotFound(name)
	}
	if err != nil {
		return Model{}, storeErr(err)
	}
	var m Model
	err = json.Unmarshal(b, &m)
	return m, err
}

// Models returns every model, sorted by name.
func (s *Store) Models(ctx context.Context) ([]Model, error) {
	all, err := s.rdb.HGetAll(ctx, keyModels).Result()
	if err != nil {
		return nil, storeErr(err)
	}
	return decodeModels(all), nil
}

// decodeModels decodes the models hash, sorted by name.
func decodeModels(all map[string]string) []Model {
	out := make([]Model, 0, len(all))
	for _, v := range all {
		var m Model
		if json.Unmarshal([]byte(v), &m) == nil {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	return out
}
