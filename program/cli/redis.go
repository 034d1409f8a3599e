package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/registry"
)

// redisFlags are the flags that name the Redis (docs/redis.md): one of a
// single node, a Sentinel-watched master or a Cluster, in go-redis's URL
// forms, and what a durable write waits for.
type redisFlags struct {
	fs   *pflag.FlagSet
	topo *registry.Topology
}

// registerRedis defines --redis-url (its usage is what the role keeps
// there), --redis-sentinel and --redis-cluster on fs, t's values as
// defaults; durable (a role that writes usage records and API keys) adds
// --redis-min-replicas and --redis-replica-timeout. Call check after
// parsing.
func registerRedis(fs *pflag.FlagSet, t *registry.Topology, urlUsage string, durable bool) redisFlags {
	fs.StringVar(&t.URL, "redis-url", t.URL, urlUsage+"; one node: redis://[user:pass@]host:port/db, rediss:// for TLS")
	fs.StringVar(&t.Sentinel, "redis-sentinel", t.Sentinel, "instead of --redis-url, a master that Redis Sentinel watches: redis://[user:pass@]sentinel1:26379?master_name=NAME&addr=sentinel2:26379&addr=...&username=U&password=P (user:pass: the sentinels' login; username, password: the master's; rediss:// for TLS)")
	fs.StringVar(&t.Cluster, "redis-cluster", t.Cluster, "instead of --redis-url, a Redis Cluster: redis://[user:pass@]node1:6379?addr=node2:6379&addr=... (any nodes: the others are learned; rediss:// for TLS)")
	if durable {
		fs.Var(replicasValue{&t.MinReplicas}, "redis-min-replicas", "replicas that must confirm a usage record, and an API key's creation or deletion, before it counts as written (WAIT; else the record waits in JetStream and is tried again): auto is 1 with --redis-sentinel or --redis-cluster and 0 with --redis-url; 0: none (a master lost right after a write may lose it)")
		fs.DurationVar(&t.ReplicaTimeout, "redis-replica-timeout", t.ReplicaTimeout, "longest a write waits for --redis-min-replicas replicas to confirm it (0: 1s)")
	}
	return redisFlags{fs: fs, topo: t}
}

// check settles the defaults after parsing and reports bad input: a
// --redis-sentinel or --redis-cluster replaces --redis-url's default (only
// an --redis-url given too is a conflict), and the URL given must parse.
func (f redisFlags) check() error {
	t := f.topo
	if (t.Sentinel != "" || t.Cluster != "") && !f.fs.Changed("redis-url") {
		t.URL = ""
	}
	if !t.Configured() {
		return nil
	}
	return t.Check()
}

// redisFlag is the flag that names t's kind of Redis.
func redisFlag(t registry.Topology) string {
	switch t.Kind() {
	case registry.KindSentinel:
		return "--redis-sentinel"
	case registry.KindCluster:
		return "--redis-cluster"
	}
	return "--redis-url"
}

// replicasValue is --redis-min-replicas: "auto" (registry.ReplicasAuto),
// "0" (registry.NoReplicas) or a number of replicas.
type replicasValue struct{ n *int }

func (v replicasValue) String() string {
	switch {
	case v.n == nil || *v.n == registry.ReplicasAuto:
		return "auto"
	case *v.n < 0:
		return "0"
	}
	return strconv.Itoa(*v.n)
}

func (v replicasValue) Set(s string) error {
	if s == "auto" {
		*v.n = registry.ReplicasAuto
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want auto or a number of replicas (0: none), not %q", s)
	}
	if n == 0 {
		n = registry.NoReplicas
	}
	*v.n = n
	return nil
}

func (v replicasValue) Type() string { return "replicas" }

// runRedis is `tokenbus redis`: tools for the Redis tokenbus keeps its
// control plane in. `tokenbus redis migrate` copies a registry of the
// layout before Cluster support into the current layout (docs/redis.md).
func runRedis(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) > 0 && args[0] == "migrate":
		args = args[1:]
	case len(args) == 0 || !strings.HasPrefix(args[0], "-"):
		fmt.Fprintln(stderr, "Usage: tokenbus redis migrate --from URL (--redis-url | --redis-sentinel | --redis-cluster) DEST")
		return fmt.Errorf("tokenbus redis: want the subcommand migrate")
	} // else flags (--help): migrate's, its only subcommand
	fs := flagenv.NewFlagSet("redis migrate")
	var from string
	var topo registry.Topology
	fs.StringVar(&from, "from", "", "the Redis node holding the registry in the old layout (every key under {tokenbus}): redis://[user:pass@]host:port/db; on a Cluster or Sentinel setup, the master that serves the {tokenbus} slot")
	rf := registerRedis(fs, &topo, "where to copy it: a single node (may be the --from one: the layouts' key names differ)", true)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	if from == "" || !topo.Configured() {
		return fmt.Errorf("give --from (the old registry) and one of --redis-url, --redis-sentinel, --redis-cluster (where it goes)")
	}
	src, err := registry.Open(ctx, from)
	if err != nil {
		return fmt.Errorf("--from: %w", err)
	}
	defer src.Close()
	dst, err := registry.OpenTopology(ctx, topo)
	if err != nil {
		return err
	}
	defer dst.Close()
	m, err := registry.Migrate(ctx, src.Client(), dst)
	if err != nil {
		return fmt.Errorf("migrate (copied so far: %s; running it again is safe): %w", m, err)
	}
	fmt.Fprintf(stdout, "copied %s from %s to %s\n", m, (registry.Topology{URL: from}), topo)
	return nil
}
