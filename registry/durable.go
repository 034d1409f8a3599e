package registry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/schemas"
)

// ErrNotReplicated is the error of a durable write that its master took but
// fewer replicas than the store waits for (Topology.MinReplicas) confirmed
// in time. The write may or may not survive the master's loss, so its
// caller does it again: the writes made durable are idempotent (a usage
// record by its request id). It is a 503, and no sign that Redis is down:
// the breaker does not count it.
var ErrNotReplicated = errors.New("not confirmed by enough replicas")

func notReplicated(got, want int) error {
	return &regError{sentinel: ErrNotReplicated, api: schemas.ErrStoreUnavailable.New(),
		cause: fmt.Errorf("%d of %d replicas confirmed the write in time", got, want)}
}

// slotWrite is one write of a durable step: key names its slot (the write
// may touch other keys of that slot), write does it on c.
type slotWrite struct {
	key   string
	write func(ctx context.Context, c redis.Cmdable) error
}

// writeDurably does writes in order, each on a connection to the master that
// serves its key's slot, and then, when the store waits for replicas, sends
// WAIT on each connection used: WAIT blocks until the replicas have every
// write sent on the connection it is sent on, so it must be the writes' own
// connection (a fresh one's WAIT says nothing of them). On a Cluster the
// writes to one master share a connection and a WAIT. An error of a write
// stops the rest; the writes done stay done (the callers' writes are
// idempotent, and ordered so that a partial step shows nothing, keys.go).
func (s *Store) writeDurably(ctx context.Context, writes ...slotWrite) error {
	if s.replicas == 0 {
		for _, w := range writes {
			if err := w.write(ctx, s.rdb); err != nil {
				return err
			}
		}
		return nil
	}
	conns := map[*redis.Client]*redis.Conn{}
	var used []*redis.Conn
	defer func() {
		for _, c := range used {
			_ = c.Close()
		}
	}()
	for _, w := range writes {
		m, err := s.masterFor(ctx, w.key)
		if err != nil {
			return storeErr(err)
		}
		c, ok := conns[m]
		if !ok {
			c = m.Conn()
			conns[m] = c
			used = append(used, c)
		}
		if err := w.write(ctx, c); err != nil {
			s.reloadOn(ctx, err)
			return err
		}
	}
	for _, c := range used {
		if err := s.waitReplicas(ctx, c); err != nil {
			s.reloadOn(ctx, err)
			return err
		}
	}
	return nil
}

// masterFor is a client of the master that serves key's slot: on a Cluster
// the slot's master as the client last learned it, otherwise the client
// itself (a Sentinel client always talks to the current master).
func (s *Store) masterFor(ctx context.Context, key string) (*redis.Client, error) {
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("a %T cannot wait for replicas", s.rdb)
}

// reloadOn has a Cluster client learn the slots again after err on a
// connection it did not route itself (a master gone, a slot moved): its
// own commands do that on such errors, a borrowed connection does not.
func (s *Store) reloadOn(ctx context.Context, err error) {
	if c, ok := s.rdb.(*redis.ClusterClient); ok && err != nil && !errors.Is(err, ErrNotReplicated) {
		c.ReloadState(ctx)
	}
}

// waitReplicas sends WAIT on c: the store's replicas must confirm c's
// writes within its replica timeout (cut to what ctx leaves).
func (s *Store) waitReplicas(ctx context.Context, c *redis.Conn) error {
	wait := s.replicaWait
	if dl, ok := ctx.Deadline(); ok {
		// Leave time for the answer: a WAIT cut off by the deadline would
		// read as Redis down rather than as too few replicas.
		wait = min(wait, max(time.Until(dl)*3/4, time.Millisecond))
	}
	n, err := c.Wait(ctx, s.replicas, wait).Result()
	if err != nil {
		return storeErr(err)
	}
	if int(n) < s.replicas {
		return notReplicated(int(n), s.replicas)
	}
	return nil
}

// ReplicasShort reports a master with fewer connected replicas than the
// store's writes wait for (Topology.MinReplicas): its address and how many
// it has ("" when every master has enough, or none are waited for). Until
// it has them, usage records of the keys it holds wait in JetStream and API
// keys cannot be created: a gateway logs it at start.
func (s *Store) ReplicasShort(ctx context.Context) (addr string, have int, err error) {
	if s.replicas == 0 {
		return "", 0, nil
	}
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		n := 0
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
				n, _ = strconv.Atoi(v)
			}
		}
		if n < s.replicas && addr == "" {
			addr, have = c.Options().Addr, n
		}
		return nil
	}
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return check(ctx, m)
		})
	case *redis.Client:
		err = check(ctx, c)
	}
	return addr, have, storeErr(err)
}
