package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// TestAdapterPlacement runs `tokenbus dev` with adapter placement on, three
// sim workers of four LoRA slots: a burst of requests for one adapter gets
// it loaded on more workers ahead of demand, an adapter asked for once stays
// on one, and once the burst is over the spare replicas are unloaded.
func TestAdapterPlacement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rd, store := startStore(t)
	for _, m := range []registry.Model{
		{Name: "hot", Base: "llama-8b", Path: "sim://loras/hot"},
		{Name: "cold", Base: "llama-8b", Path: "sim://loras/cold"},
	} {
		if err := store.PutModel(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL, c.SimWorkers, c.Engine.Sim.MaxLoras = rd.URL, 3, 4
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = time.Millisecond, time.Millisecond
		c.Dispatcher.Placement = dispatcher.PlacementConfig{On: true, Every: 100 * time.Millisecond, HalfLife: time.Second,
			Up: 2, Down: 0.5, MinInterval: 300 * time.Millisecond}
	})
	beats := logBeats(t, d.NATSURL)
	placed := func(action string) float64 {
		return max(0, metricValue(t, d.URL, `tokenbus_dispatcher_adapter_placements_total{action="`+action+`",result="ok"}`))
	}
	complete := func(model string) {
		t.Helper()
		s := post(t, d.URL, "/v1/completions", `{"model":"`+model+`","prompt":"hi","max_tokens":2}`)
		if s.Status != 200 {
			t.Fatalf("%s: %d %s", model, s.Status, s.Body)
		}
	}
	complete("cold")
	// About 20 requests/s for the hot adapter until it is on every worker:
	// above Up (2/s per replica) with one or two replicas.
	testenv.WaitFor(t, 20*time.Second, func() error {
		for range 5 {
			complete("hot")
		}
		if h := beats.holders("hot"); len(h) < 3 {
			return fmt.Errorf("hot held by %v, want all three workers", h)
		}
		return nil
	})
	if h := beats.holders("cold"); len(h) != 1 {
		t.Fatalf("cold held by %v: one request should not replicate it", h)
	}
	if n := placed("load"); n < 2 {
		t.Fatalf("placement loads %v, want at least 2", n)
	}
	// Idle: the rate decays (half-life 1s) below Down, spare replicas go
	// one at a time, and the last stays.
	testenv.WaitFor(t, 30*time.Second, func() error {
		if h := beats.holders("hot"); len(h) != 1 {
			return fmt.Errorf("hot held by %v, want one worker once idle", h)
		}
		return nil
	})
	if n := placed("unload"); n < 2 {
		t.Fatalf("placement unloads %v, want at least 2", n)
	}
	if h := beats.holders("cold"); len(h) != 1 {
		t.Fatalf("cold held by %v, want still one", h)
	}
}

// TestAdapterEvictionByDemand runs `tokenbus dev` (placement off) with two
// sim workers of two LoRA slots: three adapters asked for three times each,
// then a string of adapters asked for once. The one-offs take turns in the
// fourth slot (the dispatcher sends each to the worker holding the coldest
// adapter, which evicts it); no hot adapter is evicted, where evicting the
// least recently used would push them out one by one.
// Not parallel: each placement follows from the heartbeats that came before
// it, which neighbours' load delays (h1 was once found evicted).
func TestAdapterEvictionByDemand(t *testing.T) {
	ctx := context.Background()
	rd, store := startStore(t)
	hot := []string{"h1", "h2", "h3"}
	tail := []string{"t1", "t2", "t3", "t4", "t5", "t6"}
	for _, name := range append(slices.Clone(hot), tail...) {
		if err := store.PutModel(ctx, registry.Model{Name: name, Base: "llama-8b", Path: "sim://loras/" + name}); err != nil {
			t.Fatal(err)
		}
	}
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL, c.SimWorkers, c.Engine.Sim.MaxLoras = rd.URL, 2, 2
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = time.Millisecond, time.Millisecond
	})
	beats := logBeats(t, d.NATSURL)
	complete := func(model string) {
		t.Helper()
		s := post(t, d.URL, "/v1/completions", `{"model":"`+model+`","prompt":"hi","max_tokens":2}`)
		if s.Status != 200 {
			t.Fatalf("%s: %d %s", model, s.Status, s.Body)
		}
	}
	for _, a := range hot {
		for range 3 {
			complete(a)
		}
	}
	for _, a := range tail {
		complete(a)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		for _, a := range hot {
			if h := beats.holders(a); len(h) != 1 {
				return fmt.Errorf("%s held by %v, want one worker", a, h)
			}
		}
		if h := beats.holders("t6"); len(h) != 1 {
			return fmt.Errorf("t6 held by %v, want one worker", h)
		}
		return nil
	})
	for _, a := range hot {
		if n := beats.loads(a); n != 1 {
			t.Errorf("%s loaded %d times: evicted for a one-off", a, n)
		}
	}
	evicted := max(0, metricValue(t, d.URL, `tokenbus_dispatcher_adapter_routed_total{placement="evict"}`))
	if evicted != float64(len(tail)-1) {
		t.Errorf("%v requests routed to evict, want %d (every one-off but the first, which takes the free slot)", evicted, len(tail)-1)
	}
}
