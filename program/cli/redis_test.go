package cli

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// Every role with Redis refuses two topologies and URLs that do not parse,
// at start, in words that name the flags; from the environment too.
func TestRedisFlagChecks(t *testing.T) {
	t.Setenv("TOKENBUS_ADMIN_TOKEN", "x")
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"gateway", "--redis-url", "redis://a:1", "--redis-cluster", "redis://b:2"}, nil,
			"--redis-url and --redis-cluster: give at most one of --redis-url (one node), --redis-sentinel (Sentinel) and --redis-cluster (Cluster)"},
		{[]string{"dispatcher", "--redis-sentinel", "redis://s:26379?master_name=m"}, map[string]string{"TOKENBUS_REDIS_URL": "redis://a:1"},
			"--redis-url and --redis-sentinel: give at most one"},
		{[]string{"worker", "--redis-sentinel", "redis://s:26379"}, nil, "--redis-sentinel: the URL names no master: add ?master_name=NAME"},
		{[]string{"gateway", "--redis-cluster", "redis://n1:7000?addr=n2"}, nil, "--redis-cluster: redis: unable to parse addr param: n2"},
		{[]string{"dev", "--redis-url", "http://x"}, nil, "--redis-url: redis: invalid URL scheme: http"},
		{[]string{"nats-users", "--redis-cluster", "redis://n1:7000?colour=red"}, nil, "unexpected option: colour"},
		{[]string{"gateway", "--redis-min-replicas", "-1"}, nil, `want auto or a number of replicas (0: none), not "-1"`},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		err := Run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want %q", tc.args, tc.env, err, tc.want)
		}
		for k := range tc.env {
			t.Setenv(k, "")
		}
	}
}

// --redis-sentinel and --redis-cluster replace --redis-url's default;
// --redis-min-replicas reads auto, 0 (none) and numbers.
func TestRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want registry.Topology
	}{
		{nil, registry.Topology{URL: "redis://127.0.0.1:6379/0"}},
		{[]string{"--redis-cluster", "redis://n1:7000"}, registry.Topology{Cluster: "redis://n1:7000"}},
		{[]string{"--redis-sentinel", "redis://s:1?master_name=m", "--redis-min-replicas", "0"},
			registry.Topology{Sentinel: "redis://s:1?master_name=m", MinReplicas: registry.NoReplicas}},
		{[]string{"--redis-cluster", "redis://n1:7000", "--redis-min-replicas", "2", "--redis-replica-timeout", "3s"},
			registry.Topology{Cluster: "redis://n1:7000", MinReplicas: 2, ReplicaTimeout: 3e9}},
	} {
		fs := flagenv.NewFlagSet("x")
		topo := registry.Topology{URL: "redis://127.0.0.1:6379/0"}
		rf := registerRedis(fs, &topo, "the registry", true)
		if err := flagenv.Parse(fs, tc.args, func(string) string { return "" }); err != nil {
			t.Fatal(err)
		}
		if err := rf.check(); err != nil || topo != tc.want {
			t.Errorf("%v: %+v %v, want %+v", tc.args, topo, err, tc.want)
		}
	}
}

// `tokenbus redis migrate` copies an old registry in place (the layouts'
// key names differ) and says what it copied; again, the same.
func TestRedisMigrateCommand(t *testing.T) {
	rd := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.HSet(ctx, "{tokenbus}:models", "m", `{"name":"m","created":1}`).Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var out strings.Builder
		if err := Run(ctx, []string{"redis", "migrate", "--from", rd.URL, "--redis-url", rd.URL}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), "copied 1 models, 0 API keys") {
			t.Fatalf("output %q", out.String())
		}
	}
	if v, err := rdb.HGet(ctx, "tokenbus:models", "m").Result(); err != nil || !strings.Contains(v, `"m"`) {
		t.Fatalf("tokenbus:models m = %q, %v", v, err)
	}
	if err := Run(ctx, []string{"redis", "migrate", "--from", rd.URL}, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "give --from (the old registry) and one of --redis-url") {
		t.Fatalf("no destination: %v", err)
	}
}
