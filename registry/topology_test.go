package registry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// backend is one Redis topology the registry's tests run on: the suite's
// tests each get it emptied (store) and may open more stores on it (open).
type backend struct {
	kind string
	topo registry.Topology
}

// open opens another store on the backend, closed with the test.
func (b *backend) open(t *testing.T) *registry.Store {
	t.Helper()
	s, err := registry.OpenTopology(context.Background(), b.topo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// store empties the backend (every master) and opens a store on it.
func (b *backend) store(t *testing.T) *registry.Store {
	t.Helper()
	s := b.open(t)
	ctx := context.Background()
	var err error
	if cc, ok := s.Client().(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() })
	} else {
		err = s.Client().FlushAll(ctx).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// suite is the registry's tests that hold on every topology: keys, limits,
// usage, models, quotas.
var suite = []struct {
	name string
	run  func(t *testing.T, b *backend)
}{
	{"StoreCRUD", testStoreCRUD},
	{"Adapters", testAdapters},
	{"AdapterBaseRace", testAdapterBaseRace},
	{"ModelList", testModelList},
	{"Keys", testKeys},
	{"CreateKeysConcurrently", testCreateKeysConcurrently},
	{"KeyFlow", testKeyFlow},
	{"KeyLeftovers", testKeyLeftovers},
	{"ListKeysFails", testListKeysFails},
	{"Quotas", testQuotas},
	{"RequestsPerMinute", testRequestsPerMinute},
	{"TokensPerMinute", testTokensPerMinute},
	{"RequestsPerMinuteConcurrent", testRequestsPerMinuteConcurrent},
	{"LimiterRedisClock", testLimiterRedisClock},
	{"TokensPerMinuteReserved", testTokensPerMinuteReserved},
	{"Settle", testSettle},
	{"PromptsCountAsRequests", testPromptsCountAsRequests},
	{"Readmit", testReadmit},
	{"Usage", testUsage},
	{"UsageHourly", testUsageHourly},
	{"RecordBatchSumsAsSingles", testRecordBatchSumsAsSingles},
	{"UsageAcrossShards", testUsageAcrossShards},
	{"UsageIndexOnce", testUsageIndexOnce},
	{"NotReplicated", testNotReplicated},
	{"RetryReplicated", testRetryReplicated},
	{"DeleteNotReplicated", testDeleteNotReplicated},
	{"Migrate", testMigrate},
}

// TestTopologies runs the suite on a single node, on a Sentinel-watched
// master with two replicas and on a 3-master, 3-replica Cluster, each of
// redis-server and, where it is installed, valkey-server (scripts/test
// installs both). On Sentinel and Cluster the stores wait for a replica
// (Topology.MinReplicas auto), so every durable write is checked with WAIT.
func TestTopologies(t *testing.T) {
	for _, srv := range []testenv.Server{testenv.RedisServer, testenv.ValkeyServer} {
		t.Run(string(srv), func(t *testing.T) {
			if !srv.Available() {
				if srv == testenv.RedisServer {
					t.Fatalf("%s not on PATH (scripts/test installs it)", srv)
				}
				t.Skipf("%s not on PATH: scripts/test installs it from Debian 12's bookworm-backports", srv)
			}
			for _, kind := range []string{registry.KindSingle, registry.KindSentinel, registry.KindCluster} {
				t.Run(kind, func(t *testing.T) {
					b := &backend{kind: kind}
					switch kind {
					case registry.KindSingle:
						b.topo.URL = srv.Start(t).URL
					case registry.KindSentinel:
						b.topo.Sentinel = testenv.StartSentinel(t, srv, 2).URL
					case registry.KindCluster:
						b.topo.Cluster = testenv.StartCluster(t, srv, 3, 6).URL
					}
					for _, tc := range suite {
						t.Run(tc.name, func(t *testing.T) { tc.run(t, b) })
					}
				})
			}
		})
	}
}

// A deletion cut short, and a creation cut short, leave entries that point
// to nothing: no lookup or listing shows them.
func testKeyLeftovers(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	// The record alone gone (a crash right after a deletion's first step):
	rdb := s.Client()
	if err := rdb.Del(ctx, "tokenbus:key:{"+k.ID+"}").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeyByHash(ctx, registry.HashSecret(secret)); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("a secret whose record is gone: %v", err)
	}
	if list, err := s.ListKeys(ctx); err != nil || len(list) != 0 {
		t.Fatalf("ListKeys with an index entry whose record is gone: %+v %v", list, err)
	}
	// A secret's entry naming another key's record does not find it.
	k2, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "tokenbus:secret:{"+registry.HashSecret("tb-forged")+"}", k2.ID, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeyByHash(ctx, registry.HashSecret("tb-forged")); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("a secret entry pointing at another key's record: %v", err)
	}
	if tenants, err := s.Tenants(ctx); err != nil || !slices.Equal(tenants, []string{"acme"}) {
		t.Fatalf("Tenants = %v, %v", tenants, err)
	}
}

// Tenants' own quotas: set, read, listed, removed.
func testQuotas(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	if err := s.SetTenantQuotas(ctx, "acme", registry.Quotas{Files: 3}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTenantQuotas(ctx, "beta", registry.Quotas{Batches: -1}); err != nil {
		t.Fatal(err)
	}
	if q, err := s.TenantQuotas(ctx, "acme"); err != nil || q.Files != 3 {
		t.Fatalf("acme: %+v %v", q, err)
	}
	if all, err := s.AllTenantQuotas(ctx); err != nil || len(all) != 2 || all["beta"].Batches != -1 {
		t.Fatalf("all: %+v %v", all, err)
	}
	if _, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "gamma"}); err != nil {
		t.Fatal(err)
	}
	if tenants, err := s.Tenants(ctx); err != nil || !slices.Equal(tenants, []string{"acme", "beta", "gamma"}) {
		t.Fatalf("Tenants = %v, %v", tenants, err)
	}
	if err := s.SetTenantQuotas(ctx, "acme", registry.Quotas{}); err != nil {
		t.Fatal(err)
	}
	if q, err := s.TenantQuotas(ctx, "acme"); err != nil || q != (registry.Quotas{}) {
		t.Fatalf("acme after removal: %+v %v", q, err)
	}
}

// One batch with the usage of many keys (on a Cluster: on every master)
// counts each once, also delivered again, and the totals add up.
func testUsageAcrossShards(t *testing.T, b *backend) {
	s := b.store(t)
	l, _ := newLimiter(s)
	ctx := context.Background()
	var recs []schemas.UsageRecord
	for i := range 40 {
		recs = append(recs, schemas.UsageRecord{RequestID: fmt.Sprintf("r%d", i), KeyID: fmt.Sprintf("key_%02d", i%20),
			Model: "m", Usage: schemas.Usage{PromptTokens: 2, CompletionTokens: 3}})
	}
	for i, want := range []int{0, 40} {
		if dups, err := l.RecordBatch(ctx, recs); err != nil || dups != want {
			t.Fatalf("delivery %d: %d dups, %v; want %d", i+1, dups, err, want)
		}
	}
	rows, err := s.Usage(ctx, "", "")
	if err != nil || len(rows) != 20 {
		t.Fatalf("usage of %d keys, want 20: %v", len(rows), err)
	}
	for _, r := range rows {
		if r.Requests != 2 || r.TotalTokens != 10 {
			t.Fatalf("row %+v: want 2 requests, 10 tokens", r)
		}
	}
	if cc, ok := s.Client().(*redis.ClusterClient); ok {
		// The keys did spread: every master holds some.
		var mu sync.Mutex
		per := map[string]int{}
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, "tokenbus:key:*:usage").Result()
			mu.Lock()
			per[c.Options().Addr] = len(keys)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for addr, n := range per {
			if n == 0 {
				t.Fatalf("master %s holds no key's usage: %v", addr, per)
			}
		}
	}
}

// A store that waits for more replicas than there are gets ErrNotReplicated
// (a 503 that does not open the breaker); the records it wrote on the
// master are counted once when delivered again to a store that waits for
// what there is.
func testNotReplicated(t *testing.T, b *backend) {
	s := b.store(t)
	greedy := *b
	greedy.topo.MinReplicas, greedy.topo.ReplicaTimeout = 5, 20*time.Millisecond
	g := greedy.open(t)
	br := registry.NewBreaker(registry.BreakerConfig{Timeout: time.Second, Failures: 1})
	g.UseBreaker(br)
	lg := registry.NewLimiter(g)
	ctx := context.Background()
	rec := schemas.UsageRecord{RequestID: "once", KeyID: "key_nr", Model: "m", Usage: schemas.Usage{PromptTokens: 1, CompletionTokens: 1}}
	for range 3 {
		_, err := lg.Record(ctx, rec)
		if !errors.Is(err, registry.ErrNotReplicated) || errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("Record waiting for 5 replicas: %v", err)
		}
		if e := schemas.AsError(err); e.Status != 503 {
			t.Fatalf("status %d", e.Status)
		}
	}
	if addr, have, err := g.ReplicasShort(ctx); err != nil || addr == "" || have >= 5 {
		t.Fatalf("ReplicasShort of a store that waits for 5: %q %d %v", addr, have, err)
	}
	if addr, _, err := s.ReplicasShort(ctx); err != nil || addr != "" {
		t.Fatalf("ReplicasShort of a store that waits for what there is: %q %v", addr, err)
	}
	if br.State() != registry.BreakerClosed {
		t.Fatalf("breaker %s after replicas did not confirm: it must count Redis down only", br.State())
	}
	if _, _, err := g.CreateKey(ctx, registry.KeySpec{Tenant: "t"}); !errors.Is(err, registry.ErrNotReplicated) {
		t.Fatalf("CreateKey waiting for 5 replicas: %v", err)
	}
	dup, err := registry.NewLimiter(s).Record(ctx, rec)
	if err != nil || !dup {
		t.Fatalf("redelivered to a store that waits for what there is: dup %v, %v", dup, err)
	}
	rows, err := s.Usage(ctx, "key_nr", "")
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 {
		t.Fatalf("usage %+v %v: want 1 request", rows, err)
	}
}

// Bad topologies are refused before anything connects, in words that name
// the flags.
func TestTopologyCheck(t *testing.T) {
	for _, tc := range []struct {
		topo registry.Topology
		want string // in the error; "" none
	}{
		{registry.Topology{URL: "redis://127.0.0.1:6379/0"}, ""},
		{registry.Topology{Sentinel: "redis://127.0.0.1:26379?master_name=m&addr=127.0.0.1:26380"}, ""},
		{registry.Topology{Cluster: "rediss://u:p@127.0.0.1:7000?addr=127.0.0.1:7001"}, ""},
		{registry.Topology{URL: "redis://a:1", Cluster: "redis://b:2"}, "--redis-url and --redis-cluster: give at most one"},
		{registry.Topology{URL: "redis://a:1", Sentinel: "redis://b:2?master_name=m", Cluster: "redis://b:2"}, "--redis-url and --redis-sentinel and --redis-cluster"},
		{registry.Topology{URL: "http://a:1"}, "--redis-url: redis: invalid URL scheme: http"},
		{registry.Topology{Sentinel: "redis://127.0.0.1:26379"}, "?master_name=NAME"},
		{registry.Topology{Cluster: "redis://127.0.0.1:7000?addr=nope"}, "--redis-cluster: redis: unable to parse addr param: nope"},
		{registry.Topology{Cluster: "redis://127.0.0.1:7000?colour=red"}, "unexpected option: colour"},
		{registry.Topology{URL: "redis://a:1", MinReplicas: -2}, "--redis-min-replicas"},
	} {
		err := tc.topo.Check()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.topo, err, tc.want)
		}
	}
	for _, tc := range []struct {
		topo registry.Topology
		want int
	}{
		{registry.Topology{URL: "redis://a:1"}, 0},
		{registry.Topology{URL: "redis://a:1", MinReplicas: 2}, 2},
		{registry.Topology{Sentinel: "redis://a:1?master_name=m"}, 1},
		{registry.Topology{Cluster: "redis://a:1"}, 1},
		{registry.Topology{Cluster: "redis://a:1", MinReplicas: registry.NoReplicas}, 0},
	} {
		if got := tc.topo.Replicas(); got != tc.want {
			t.Errorf("%+v: Replicas %d, want %d", tc.topo, got, tc.want)
		}
	}
	// Passwords stay out of what is logged.
	if s := (registry.Topology{Cluster: "redis://u:secret@h1:7000?addr=h2:7001"}).String(); strings.Contains(s, "secret") || s != "Redis Cluster at h1:7000,h2:7001" {
		t.Errorf("String = %q", s)
	}
}

// A batch delivered again whose records are all counted already is still
// confirmed by the replicas, never acked on a WAIT that confirms nothing:
// a store that waits for more replicas than there are refuses it every
// time, and on a topology with replicas the retry writes to every master
// it touches (the index's and the key's), so that its WAIT covers the first
// delivery's writes (WAIT waits for its connection's last write only).
func testRetryReplicated(t *testing.T, b *backend) {
	s := b.store(t)
	greedy := *b
	greedy.topo.MinReplicas, greedy.topo.ReplicaTimeout = 5, 20*time.Millisecond
	lg := registry.NewLimiter(greedy.open(t))
	ctx := context.Background()
	batch := []schemas.UsageRecord{
		{RequestID: "a", KeyID: "key_rr1", Model: "m", Usage: schemas.Usage{PromptTokens: 1}},
		{RequestID: "b", KeyID: "key_rr2", Model: "m", Usage: schemas.Usage{PromptTokens: 1}},
	}
	for i := range 2 {
		if _, err := lg.RecordBatch(ctx, batch); !errors.Is(err, registry.ErrNotReplicated) {
			t.Fatalf("delivery %d to a store that waits for 5 replicas: %v", i+1, err)
		}
	}
	if b.topo.Replicas() == 0 {
		return
	}
	l := registry.NewLimiter(s)
	if dups, err := l.RecordBatch(ctx, batch); err != nil || dups != 2 {
		t.Fatalf("delivered again: %d dups, %v", dups, err)
	}
	masters := func() map[string]int64 {
		out := map[string]int64{}
		for _, key := range []string{"tokenbus:usage:keys", "tokenbus:key:{key_rr1}:rl", "tokenbus:key:{key_rr2}:rl"} {
			m, ok := s.Client().(*redis.Client)
			if cc, isCluster := s.Client().(*redis.ClusterClient); isCluster {
				var err error
				if m, err = cc.MasterForKey(ctx, key); err != nil {
					t.Fatal(err)
				}
			} else if !ok {
				t.Fatalf("a %T", s.Client())
			}
			info, err := m.Info(ctx, "replication").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_repl_offset:"); ok {
					var n int64
					fmt.Sscan(v, &n)
					out[m.Options().Addr] = n
				}
			}
		}
		return out
	}
	before := masters()
	// A new Limiter (as after a restart) writes the index too.
	if dups, err := registry.NewLimiter(s).RecordBatch(ctx, batch); err != nil || dups != 2 {
		t.Fatalf("delivered again: %d dups, %v", dups, err)
	}
	for addr, n := range masters() {
		if n <= before[addr] {
			t.Fatalf("master %s: replication offset %d before an all-duplicate batch, %d after: it wrote nothing its WAIT could confirm", addr, before[addr], n)
		}
	}
}

// A deletion whose replicas did not confirm it in time deleted the key on
// the master: DeleteKey says ErrNotReplicated, the secret's and the index's
// entries are cleared all the same, and DeleteKey again finds no key.
func testDeleteNotReplicated(t *testing.T, b *backend) {
	s := b.store(t)
	greedy := *b
	greedy.topo.MinReplicas, greedy.topo.ReplicaTimeout = 5, 20*time.Millisecond
	g := greedy.open(t)
	ctx := context.Background()
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.DeleteKey(ctx, k.ID); !errors.Is(err, registry.ErrNotReplicated) {
		t.Fatalf("DeleteKey waiting for 5 replicas: %v", err)
	}
	if _, err := s.Key(ctx, k.ID); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("the key after its deletion: %v", err)
	}
	if _, err := s.KeyByHash(ctx, registry.HashSecret(secret)); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("the key's secret after its deletion: %v", err)
	}
	rdb := s.Client()
	if n, err := rdb.Exists(ctx, "tokenbus:secret:{"+registry.HashSecret(secret)+"}").Result(); err != nil || n != 0 {
		t.Fatalf("the secret's entry left: %d %v", n, err)
	}
	if in, err := rdb.SIsMember(ctx, "tokenbus:keys", k.ID).Result(); err != nil || in {
		t.Fatalf("the index entry left: %v %v", in, err)
	}
	if err := g.DeleteKey(ctx, k.ID); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("DeleteKey again: %v", err)
	}
}

// ListKeys skips an index entry whose record is missing, but fails, never
// lists short, when reading another record fails.
func testListKeysFails(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	if _, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	rdb := s.Client()
	if err := rdb.SAdd(ctx, "tokenbus:keys", "key_gone", "key_broken").Err(); err != nil {
		t.Fatal(err)
	}
	// Neither key_gone nor key_broken has a record yet.
	if list, err := s.ListKeys(ctx); err != nil || len(list) != 1 {
		t.Fatalf("ListKeys with entries whose records are gone: %+v %v", list, err)
	}
	if err := rdb.HSet(ctx, "tokenbus:key:{key_broken}", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 { // the set's order varies: the failure must show whatever it is
		if list, err := s.ListKeys(ctx); err == nil {
			t.Fatalf("ListKeys with a record it cannot read: %+v, no error", list)
		}
	}
}

// A Limiter writes the usage index only for keys it has not indexed yet:
// while the index cannot be written, the usage of keys it indexed goes on,
// and a batch with a key new to it fails, that key's records uncounted
// (they come again), and counts once the index can be written.
func testUsageIndexOnce(t *testing.T, b *backend) {
	s := b.store(t)
	l, _ := newLimiter(s)
	ctx := context.Background()
	rec := func(req, key string) schemas.UsageRecord {
		return schemas.UsageRecord{RequestID: req, KeyID: key, Model: "m", Usage: schemas.Usage{PromptTokens: 1}}
	}
	if _, err := l.Record(ctx, rec("r1", "key_known")); err != nil {
		t.Fatal(err)
	}
	rdb := s.Client()
	if err := rdb.Set(ctx, "tokenbus:usage:keys", "not a set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(ctx, rec("r2", "key_known")); err != nil {
		t.Fatalf("a key indexed already, the index unwritable: %v", err)
	}
	batch := []schemas.UsageRecord{rec("r3", "key_known"), rec("r4", "key_new")}
	if _, err := l.RecordBatch(ctx, batch); err == nil {
		t.Fatal("a batch with a key not indexed, the index unwritable: no error")
	}
	if _, err := registry.NewLimiter(s).Record(ctx, rec("r5", "key_known")); err == nil {
		t.Fatal("another Limiter (process) with the index unwritable: no error")
	}
	if err := rdb.Del(ctx, "tokenbus:usage:keys").Err(); err != nil {
		t.Fatal(err)
	}
	if dups, err := l.RecordBatch(ctx, batch); err != nil || dups != 0 {
		t.Fatalf("the batch again: %d dups, %v", dups, err)
	}
	rows, err := s.Usage(ctx, "key_new", "")
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 {
		t.Fatalf("key_new's usage %+v %v: want 1 request", rows, err)
	}
}
