package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/program"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// TestAdapterPlacement runs `tokenbus dev` with adapter placement on, three
// sim workers of four LoRA slots: a burst of requests for one adapter gets
// it loaded on more workers ahead of demand, an adapter asked for once stays
// on one, and once the burst is over the spare replicas are unloaded.
func TestAdapterPlacement(t *testing.T) {
	ctx := context.Background()
	rd := testenv.StartRedis(t)
	store, err := registry.Open(ctx, rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, m := range []registry.Model{
		{Name: "hot", Base: "llama-8b", Path: "sim://loras/hot"},
		{Name: "cold", Base: "llama-8b", Path: "sim://loras/cold"},
	} {
		if err := store.PutModel(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	d := startDev(t, func(c *program.DevConfig) {
		c.RedisURL, c.SimWorkers, c.Engine.Sim.MaxLoras = rd.URL, 3, 4
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
