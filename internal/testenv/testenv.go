package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/embedded"
	"github.com/tokenbus/tokenbus/internal/freeport"
)

// NATS starts a NATS server with JetStream on a random port; it stops with the test.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := embedded.NATS("127.0.0.1:0", t.TempDir()) // the server `tokenbus dev` runs
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// Connect connects to ns; the connection closes with the test.
func Connect(t testing.TB, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Redis is a redis-server child process.
type Redis struct {
	URL  string
	Addr string
	Port int
	cmd  *exec.Cmd
	dir  string
	args []string
}

// StartRedis starts redis-server on a free port with no persistence; it is
// killed with the test. redis-server must be on PATH (the README's test
// command installs it). args are more redis-server options, e.g.
// DurableRedis.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found on PATH: install it (Debian: apt-get install redis-server) or run the README's test command")
	}
	r := &Redis{dir: t.TempDir(), args: args}
	r.Port = FreePort(t)
	if err := r.start(bin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func (r *Redis) start(bin string) error {
	r.Addr = "127.0.0.1:" + strconv.Itoa(r.Port)
	r.URL = "redis://" + r.Addr + "/0"
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--logfile", filepath.Join(r.dir, "redis.log"))
	r.cmd.Args = append(r.cmd.Args, r.args...)
	if err := r.cmd.Start(); err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	err := poll(10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return rdb.Ping(ctx).Err()
	})
	if err == nil {
		return nil
	}
	log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	return fmt.Errorf("redis-server did not answer on %s (%v); log:\n%s", r.Addr, err, log)
}

// Stop kills the server (to test an outage); Restart brings it back on the same port.
func (r *Redis) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// DurableRedis are StartRedis options under which every write Redis
// acknowledged survives a SIGKILL and Restart: an append-only file synced
// on every write.
var DurableRedis = []string{"--appendonly", "yes", "--appendfsync", "always"}

// Pid is the redis-server's process id (to SIGSTOP it), 0 when stopped.
func (r *Redis) Pid() int {
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Restart starts the server again on the same port (empty: no persistence).
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	bin, _ := exec.LookPath("redis-server")
	if err := r.start(bin); err != nil {
		t.Fatal(err)
	}
}

// FreePort returns a TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.TCP()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// WaitFor polls cond until it returns nil; if timeout passes first, it
// fails the test with cond's last error, which should say what is still
// awaited and why ("running 2, want 0"), as nats-server's checkFor does. Use
// it instead of sleeping. It polls every millisecond at first, then less
// often, up to every 10ms: a short wait ends soon after its condition holds,
// a long one costs little CPU.
func WaitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("timed out after %s: %v", timeout, err)
	}
}

// poll is WaitFor's loop: cond's last error if timeout passed first.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 10*time.Millisecond)
	}
}
