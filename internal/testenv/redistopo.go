package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a Redis-compatible server's binary on PATH: redis-server or
// Valkey's valkey-server (the same protocol, Sentinel and Cluster).
type Server string

// The servers the topology helpers start.
const (
	RedisServer  Server = "redis-server"
	ValkeyServer Server = "valkey-server"
)

// Available reports whether the server and its CLI are on PATH.
func (s Server) Available() bool {
	_, err1 := exec.LookPath(string(s))
	_, err2 := exec.LookPath(s.cli())
	return err1 == nil && err2 == nil
}

// cli is the server's command-line client (which builds clusters).
func (s Server) cli() string { return strings.TrimSuffix(string(s), "-server") + "-cli" }

// Start starts one node of s: StartRedis's server with s's binary and
// more options; it is killed with the test.
func (s Server) Start(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath(string(s))
	if err != nil {
		t.Fatalf("%s not found on PATH: install it (Debian: apt-get install %s) or run scripts/test", s, s)
	}
	// A replica's first sync is at once, not after the default 5 s wait
	// for more replicas to share a diskless transfer.
	r := &Redis{dir: t.TempDir(), args: append([]string{"--repl-diskless-sync-delay", "0"}, args...)}
	r.Port = FreePort(t)
	if err := r.start(bin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// Sentinel is a master with replicas and three sentinels watching it, all
// on ports picked at run time. A sentinel takes the master as down after
// 500 ms without an answer, so a failover takes a second or two.
type Sentinel struct {
	Name      string   // the master's name in the sentinels' `sentinel monitor`
	URL       string   // go-redis's failover URL: every sentinel and the master's name
	Nodes     []*Redis // the data nodes: the first master at first, then its replicas
	Sentinels []*Redis // the sentinels (Redis is a process handle; Stop kills it)
}

// StartSentinel starts a master, replicas replicas of it and three
// sentinels (quorum 2), and returns once every sentinel knows the master,
// its replicas and the other sentinels, so that a failover can happen.
func StartSentinel(t testing.TB, s Server, replicas int) *Sentinel {
	t.Helper()
	st := &Sentinel{Name: "tokenbus"}
	master := s.Start(t)
	st.Nodes = append(st.Nodes, master)
	for range replicas {
		st.Nodes = append(st.Nodes, s.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port)))
	}
	bin, _ := exec.LookPath(string(s))
	var addrs []string
	for range 3 {
		sn := &Redis{dir: t.TempDir()}
		sn.Port = FreePort(t)
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s 500\n"+
			"sentinel failover-timeout %s 10000\n"+
			"sentinel parallel-syncs %s %d\n",
			sn.Port, sn.dir, filepath.Join(sn.dir, "sentinel.log"), st.Name, master.Port, st.Name, st.Name, st.Name, max(replicas, 1))
		path := filepath.Join(sn.dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		sn.Addr = "127.0.0.1:" + strconv.Itoa(sn.Port)
		sn.URL = "redis://" + sn.Addr
		sn.cmd = exec.Command(bin, path, "--sentinel")
		if err := sn.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sn.Stop)
		st.Sentinels = append(st.Sentinels, sn)
		addrs = append(addrs, sn.Addr)
	}
	st.URL = "redis://" + addrs[0] + "?master_name=" + st.Name
	for _, a := range addrs[1:] {
		st.URL += "&addr=" + a
	}
	WaitFor(t, 30*time.Second, func() error { return st.ready(replicas) })
	return st
}

// ready says what the sentinels do not know yet.
func (st *Sentinel) ready(replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, sn := range st.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
		reps, err := sc.Replicas(ctx, st.Name).Result()
		if err == nil && len(reps) < replicas {
			err = fmt.Errorf("knows %d of %d replicas", len(reps), replicas)
		}
		for _, r := range reps {
			if flags := r["flags"]; err == nil && (strings.Contains(flags, "down") || strings.Contains(flags, "disconnected")) {
				err = fmt.Errorf("replica %v is %s", r["name"], flags)
			}
		}
		if err == nil {
			var others []map[string]string
			if others, err = sc.Sentinels(ctx, st.Name).Result(); err == nil && len(others) < len(st.Sentinels)-1 {
				err = fmt.Errorf("knows %d of the %d other sentinels", len(others), len(st.Sentinels)-1)
			}
		}
		_ = sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sn.Addr, err)
		}
	}
	return nil
}

// MasterAddr is the master's address as the first sentinel that answers
// says.
func (st *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	var addr string
	WaitFor(t, 10*time.Second, func() error {
		var err error
		addr, err = st.masterAddr()
		return err
	})
	return addr
}

func (st *Sentinel) masterAddr() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var errs []error
	for _, sn := range st.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
		a, err := sc.GetMasterAddrByName(ctx, st.Name).Result()
		_ = sc.Close()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("no sentinel names the master: %w", errors.Join(errs...))
}

// node is the data node at addr.
func (st *Sentinel) node(addr string) *Redis {
	for _, n := range st.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// KillMaster kills the current master with SIGKILL and returns its address.
func (st *Sentinel) KillMaster(t testing.TB) string {
	t.Helper()
	addr := st.MasterAddr(t)
	n := st.node(addr)
	if n == nil {
		t.Fatalf("the sentinels' master %s is none of the nodes", addr)
	}
	n.Stop()
	return addr
}

// WaitFailover waits until every sentinel names a master other than old and
// that master says it is one; it returns the new master's address.
func (st *Sentinel) WaitFailover(t testing.TB, old string, timeout time.Duration) string {
	t.Helper()
	var addr string
	WaitFor(t, timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for _, sn := range st.Sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
			a, err := sc.GetMasterAddrByName(ctx, st.Name).Result()
			_ = sc.Close()
			if err != nil || len(a) != 2 {
				return fmt.Errorf("sentinel %s: %v", sn.Addr, err)
			}
			if addr = a[0] + ":" + a[1]; addr == old {
				return fmt.Errorf("sentinel %s still names %s", sn.Addr, old)
			}
		}
		return isMaster(ctx, addr)
	})
	return addr
}

// isMaster checks that the node at addr says it is a master.
func isMaster(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "role:master") {
		return fmt.Errorf("%s is not a master yet", addr)
	}
	return nil
}

// Cluster is a Redis Cluster on ports picked at run time (each node's
// cluster bus on a port of its own, cluster-port). A master is taken as
// failed after 1 s without an answer, and its replica promoted.
type Cluster struct {
	URL   string   // go-redis's cluster URL: every node as a seed
	Nodes []*Redis // every node
}

// StartCluster starts nodes nodes and makes them a cluster with masters
// masters (the others replicas, spread over the masters by redis-cli), and
// returns once every node serves every slot and every replica is in sync.
// A spare replica (nodes > 2*masters) migrates on its own to a master left
// without one by a failover (cluster-migration-barrier 1).
func StartCluster(t testing.TB, s Server, masters, nodes int) *Cluster {
	t.Helper()
	if masters < 3 || nodes < masters {
		t.Fatalf("StartCluster: %d nodes for %d masters", nodes, masters)
	}
	c := &Cluster{}
	var addrs []string
	for range nodes {
		n := s.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-port", strconv.Itoa(FreePort(t)),
			"--cluster-migration-barrier", "1")
		c.Nodes = append(c.Nodes, n)
		addrs = append(addrs, n.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(nodes/masters-1), "--cluster-yes")
	out, err := exec.Command(s.cli(), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --cluster create: %v\n%s", s.cli(), err, out)
	}
	c.URL = "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	c.WaitHealthy(t, 30*time.Second)
	return c
}

// WaitHealthy waits until every live node says the cluster is ok and every
// live replica is in sync with its master.
func (c *Cluster) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, c.healthy)
}

func (c *Cluster) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if n.Pid() == 0 {
			continue
		}
		rdb := redis.NewClient(&redis.Options{Addr: n.Addr})
		info, err := rdb.ClusterInfo(ctx).Result()
		var repl string
		if err == nil {
			repl, err = rdb.Info(ctx, "replication").Result()
		}
		_ = rdb.Close()
		switch {
		case err != nil:
			return fmt.Errorf("node %s: %w", n.Addr, err)
		case !strings.Contains(info, "cluster_state:ok"):
			return fmt.Errorf("node %s: cluster not ok yet", n.Addr)
		case strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up"):
			return fmt.Errorf("replica %s: not in sync with its master yet", n.Addr)
		}
	}
	return nil
}

// Client is a cluster client on c, closed with the test.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	o, err := redis.ParseClusterURL(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// MasterOf is the address of the master that serves key's slot, as the
// live nodes say (CLUSTER SLOTS of the first that answers).
func (c *Cluster) MasterOf(t testing.TB, key string) string {
	t.Helper()
	var addr string
	WaitFor(t, 10*time.Second, func() error {
		var err error
		addr, err = c.masterOf(key)
		return err
	})
	return addr
}

func (c *Cluster) masterOf(key string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if n.Pid() == 0 {
			continue
		}
		rdb := redis.NewClient(&redis.Options{Addr: n.Addr})
		s, err := rdb.ClusterKeySlot(ctx, key).Result()
		var slots []redis.ClusterSlot
		if err == nil {
			slots, err = rdb.ClusterSlots(ctx).Result()
		}
		_ = rdb.Close()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= s && s <= int64(r.End) && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr, nil
			}
		}
	}
	return "", fmt.Errorf("no live node says which master serves %q", key)
}

// KillMasterOf kills (SIGKILL) the master that serves key's slot and
// returns its address.
func (c *Cluster) KillMasterOf(t testing.TB, key string) string {
	t.Helper()
	addr := c.MasterOf(t, key)
	for _, n := range c.Nodes {
		if n.Addr == addr {
			n.Stop()
			return addr
		}
	}
	t.Fatalf("the master %s of %q is none of the nodes", addr, key)
	return ""
}

// WaitFailover waits until a node other than old serves key's slot and the
// live nodes say the cluster is ok; it returns the new master's address.
func (c *Cluster) WaitFailover(t testing.TB, key, old string, timeout time.Duration) string {
	t.Helper()
	var addr string
	WaitFor(t, timeout, func() error {
		var err error
		if addr, err = c.masterOf(key); err != nil {
			return err
		}
		if addr == old {
			return fmt.Errorf("%s still serves %q", old, key)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := isMaster(ctx, addr); err != nil {
			return err
		}
		for _, n := range c.Nodes {
			if n.Pid() == 0 {
				continue
			}
			rdb := redis.NewClient(&redis.Options{Addr: n.Addr})
			info, err := rdb.ClusterInfo(ctx).Result()
			_ = rdb.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("node %s: cluster not ok (%v)", n.Addr, err)
			}
		}
		return nil
	})
	return addr
}
