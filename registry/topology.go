package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Topology names the Redis tokenbus keeps its control plane in: exactly one
// of a single node, a master that Redis Sentinel watches over, or a Redis
// Cluster, each in go-redis's own URL form (docs/redis.md). Valkey speaks
// the same protocol and is named the same way.
type Topology struct {
	// URL is a single node: redis://[user:pass@]host:port/db, or rediss://
	// for TLS (redis.ParseURL).
	URL string
	// Sentinel is a master found through Sentinel:
	// redis://[sentinel-user:sentinel-pass@]sentinel1:26379?master_name=NAME
	// &addr=sentinel2:26379&addr=...&username=U&password=P, the userinfo
	// being the sentinels' ACL user and username/password the master's
	// (redis.ParseFailoverURL); rediss:// for TLS to both.
	Sentinel string
	// Cluster is a Redis Cluster: redis://[user:pass@]seed1:6379?addr=
	// seed2:6379&addr=... (redis.ParseClusterURL); rediss:// for TLS. Any
	// node will do as a seed: the client learns the others from it.
	Cluster string
	// MinReplicas is how many replicas must hold a usage record (and an API
	// key's creation or deletion) before tokenbus takes it as written:
	// Redis replicates asynchronously, and a write that the master
	// acknowledged and then died with is gone after a replica's promotion.
	// 0 (ReplicasAuto): 1 on Sentinel and Cluster, none on a single node;
	// NoReplicas: none.
	MinReplicas int
	// ReplicaTimeout bounds the wait for those replicas (default 1 s); past
	// it the write counts as failed and its caller tries again (a usage
	// record stays in JetStream).
	ReplicaTimeout time.Duration
}

// MinReplicas values with a meaning of their own.
const (
	ReplicasAuto = 0
	NoReplicas   = -1
)

// The kinds of Topology.
const (
	KindNone     = ""
	KindSingle   = "single"
	KindSentinel = "sentinel"
	KindCluster  = "cluster"
)

// Kind is which of the three the topology names ("" for none).
func (t Topology) Kind() string {
	switch {
	case t.URL != "":
		return KindSingle
	case t.Sentinel != "":
		return KindSentinel
	case t.Cluster != "":
		return KindCluster
	}
	return KindNone
}

// Configured reports whether the topology names a Redis at all.
func (t Topology) Configured() bool { return t.URL != "" || t.Sentinel != "" || t.Cluster != "" }

// Replicas is the number of replicas a durable write waits for.
func (t Topology) Replicas() int {
	switch {
	case t.MinReplicas > 0:
		return t.MinReplicas
	case t.MinReplicas < 0:
		return 0
	case t.Kind() == KindSentinel || t.Kind() == KindCluster:
		return 1
	}
	return 0
}

func (t Topology) replicaTimeout() time.Duration {
	if t.ReplicaTimeout <= 0 {
		return time.Second
	}
	return t.ReplicaTimeout
}

// Check reports a topology that names more than one Redis, or a URL that
// does not parse, in words that name the flags (--redis-url,
// --redis-sentinel, --redis-cluster). It builds no client.
func (t Topology) Check() error {
	_, err := t.parse()
	return err
}

// parse checks the topology and parses its URL into the options of its
// client, returned as the function that builds the client (nothing is
// dialled yet). It is the one place tokenbus makes a Redis client.
func (t Topology) parse() (func() redis.UniversalClient, error) {
	var given []string
	for _, g := range []struct{ flag, v string }{{"--redis-url", t.URL}, {"--redis-sentinel", t.Sentinel}, {"--redis-cluster", t.Cluster}} {
		if g.v != "" {
			given = append(given, g.flag)
		}
	}
	if len(given) > 1 {
		return nil, fmt.Errorf("%s: give at most one of --redis-url (one node), --redis-sentinel (Sentinel) and --redis-cluster (Cluster)",
			strings.Join(given, " and "))
	}
	if t.MinReplicas < NoReplicas {
		return nil, fmt.Errorf("--redis-min-replicas %d: want auto, 0 (none) or a number of replicas", t.MinReplicas)
	}
	switch t.Kind() {
	case KindSingle:
		o, err := redis.ParseURL(t.URL)
		if err != nil {
			return nil, fmt.Errorf("--redis-url: %w", err)
		}
		tune(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.DialerRetries,
			&o.DialerRetryTimeout)
		return func() redis.UniversalClient { return redis.NewClient(o) }, nil
	case KindSentinel:
		o, err := redis.ParseFailoverURL(t.Sentinel)
		if err != nil {
			return nil, fmt.Errorf("--redis-sentinel: %w", err)
		}
		if o.MasterName == "" {
			return nil, errors.New("--redis-sentinel: the URL names no master: add ?master_name=NAME (the name in the sentinels' `sentinel monitor`)")
		}
		tune(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.DialerRetries,
			&o.DialerRetryTimeout)
		return func() redis.UniversalClient { return redis.NewFailoverClient(o) }, nil
	case KindCluster:
		o, err := redis.ParseClusterURL(t.Cluster)
		if err != nil {
			return nil, fmt.Errorf("--redis-cluster: %w", err)
		}
		tune(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.DialerRetries,
			&o.DialerRetryTimeout)
		return func() redis.UniversalClient { return redis.NewClusterClient(o) }, nil
	}
	return nil, errors.New("no Redis named: give --redis-url, --redis-sentinel or --redis-cluster")
}

// String describes the topology without its passwords, for logs and errors.
func (t Topology) String() string {
	switch t.Kind() {
	case KindSingle:
		if o, err := redis.ParseURL(t.URL); err == nil {
			return "Redis at " + o.Addr
		}
	case KindSentinel:
		if o, err := redis.ParseFailoverURL(t.Sentinel); err == nil {
			return fmt.Sprintf("Redis master %q of the sentinels at %s", o.MasterName, strings.Join(o.SentinelAddrs, ","))
		}
	case KindCluster:
		if o, err := redis.ParseClusterURL(t.Cluster); err == nil {
			return "Redis Cluster at " + strings.Join(o.Addrs, ",")
		}
	case KindNone:
		return "no Redis"
	}
	return "Redis (" + t.Kind() + ", a URL that does not parse)"
}

// The tuning every client gets, unless its URL says otherwise: bounded
// dials and reads, and while Redis is down every call fails after one
// quick redial, not go-redis's five attempts: callers fall back to caches
// or fail open.
const (
	dialTimeout        = 2 * time.Second
	ioTimeout          = 2 * time.Second
	maxRetries         = 1
	dialerRetries      = 2
	dialerRetryTimeout = 50 * time.Millisecond
)

// tune gives a client's options tokenbus's timeouts and retries where the
// URL set none (the three topologies' options are three types with the
// same fields).
func tune(ctxTimeout *bool, dial, read, write *time.Duration, retries, redials *int, redialWait *time.Duration) {
	*ctxTimeout = true
	*dial = cmp.Or(*dial, dialTimeout)
	*read = cmp.Or(*read, ioTimeout)
	*write = cmp.Or(*write, ioTimeout)
	*retries = cmp.Or(*retries, maxRetries)
	*redials = cmp.Or(*redials, dialerRetries)
	*redialWait = cmp.Or(*redialWait, dialerRetryTimeout)
}

// OpenTopology connects to the Redis t names and checks it answers (on a
// Cluster: that every slot is served).
func OpenTopology(ctx context.Context, t Topology) (*Store, error) {
	newClient, err := t.parse()
	if err != nil {
		return nil, err
	}
	rdb := newClient()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := ping(pctx, rdb); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("%s: %w", t, err)
	}
	return &Store{rdb: rdb, replicas: t.Replicas(), replicaWait: t.replicaTimeout()}, nil
}

// ping checks that the Redis answers: on a Cluster every master, and that
// the cluster serves all its slots (a cluster still forming or missing a
// master answers PING but refuses keys).
func ping(ctx context.Context, rdb redis.UniversalClient) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb.Ping(ctx).Err()
	}
	info, err := cc.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return errors.New("the cluster is not serving every slot (cluster_state is not ok)")
	}
	return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
}
