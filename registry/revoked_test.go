package registry_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// commandsProcessed is redis-server's count of commands it has served.
func commandsProcessed(t *testing.T, rdb redis.UniversalClient) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// Revocations against a real redis-server and nats-server: a live key costs
// one Redis call per TTL however often it is asked about; its deletion is
// seen at the next question after the keys event; a deleted key stays
// revoked through a Redis outage, a key with no news is not (fails open),
// and a key named by an event Redis could not confirm since is (fails
// closed).
func TestRevocations(t *testing.T) {
	rd := testenv.StartRedis(t, testenv.DurableRedis...)
	s, err := registry.Open(context.Background(), rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	nc := testenv.Connect(t, testenv.NATS(t))
	ctx := context.Background()
	const ttl = 2 * time.Second
	rev := registry.NewRevocations(s, ttl, nil)
	stop, err := rev.Subscribe(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	live, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	doomed, _, _ := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	quiet, _, _ := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	suspect, _, _ := s.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})

	if rev.Revoked(ctx, "") {
		t.Fatal(`"" (no key) is revoked`)
	}
	if !rev.Revoked(ctx, "key_neverexisted") {
		t.Fatal("a key id Redis does not know is not revoked")
	}
	before := commandsProcessed(t, s.Client())
	for range 1000 {
		if rev.Revoked(ctx, live.ID) {
			t.Fatal("a live key is revoked")
		}
	}
	// One HGET, and the INFO call itself.
	if n := commandsProcessed(t, s.Client()) - before; n > 2 {
		t.Fatalf("1,000 questions about one key made %d Redis commands, want 1 (and the INFO)", n-1)
	}
	for _, k := range []registry.Key{doomed, quiet, suspect} {
		if rev.Revoked(ctx, k.ID) {
			t.Fatalf("live key %s revoked", k.ID)
		}
	}

	// Deleted and announced: revoked at the next question, TTL or not.
	if err := s.DeleteKey(ctx, doomed.ID); err != nil {
		t.Fatal(err)
	}
	if rev.Revoked(ctx, doomed.ID) {
		t.Fatal("a deletion not announced yet is seen before the TTL: the cache asks Redis on every question")
	}
	if err := registry.AnnounceKeys(nc, doomed.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !rev.Revoked(ctx, doomed.ID) {
			return errors.New("the deleted key is not revoked yet")
		}
		return nil
	})
	if rev.Revoked(ctx, live.ID) {
		t.Fatal("another key's event revoked a live key")
	}

	// suspect is deleted and announced, and Redis goes down before anyone
	// asks: revoked (fails closed). quiet has no news: not revoked (fails
	// open). doomed stays revoked.
	if err := s.DeleteKey(ctx, suspect.ID); err != nil {
		t.Fatal(err)
	}
	rd.Stop()
	if err := registry.AnnounceKeys(nc, suspect.ID); err != nil {
		t.Fatal(err)
	}
	if err := registry.AnnounceKeys(nc, live.ID); err != nil { // a key event Redis cannot confirm
		t.Fatal(err)
	}
	// The events are delivered in order on one connection: once live's is
	// in, suspect's is too.
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !rev.Revoked(ctx, live.ID) {
			return errors.New("the event naming the key has not arrived")
		}
		return nil
	})
	if !rev.Revoked(ctx, suspect.ID) {
		t.Fatal("a key announced as changed, Redis down: not revoked")
	}
	if !rev.Revoked(ctx, doomed.ID) {
		t.Fatal("a deleted key came back while Redis is down")
	}
	fresh := registry.NewRevocations(s, ttl, nil) // a gateway that saw nothing
	if fresh.Revoked(ctx, quiet.ID) {
		t.Fatal("Redis down, no news of the key: revoked (it should fail open)")
	}

	// Redis back (its writes survived): the live key is confirmed within a
	// TTL and no longer suspected; the deleted ones stay revoked.
	rd.Restart(t)
	testenv.WaitFor(t, 3*ttl, func() error {
		if rev.Revoked(ctx, live.ID) {
			return errors.New("the live key is still taken as revoked")
		}
		return nil
	})
	if !rev.Revoked(ctx, suspect.ID) || !rev.Revoked(ctx, doomed.ID) {
		t.Fatal("a deleted key is not revoked once Redis is back")
	}
}
