package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Many concurrent requests against a small KV cache and batch, with
// cancellations, sink errors, n>1, stop strings and shared prefixes: the
// counts and the cache must come back to empty.
func TestStress(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.NumBlocks = 48
	cfg.MaxModelLen = 128
	cfg.MaxNumSeqs = 8
	cfg.DecodeBase = 50 * time.Microsecond
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < 15; i++ {
				ctx, cancel := context.WithCancel(context.Background())
				stopAt := rng.IntN(40)
				sink := &recSink{onCall: func(n int) error {
					switch {
					case stopAt == 1 && n == 3:
						cancel()
					case stopAt == 2 && n == 3:
						return fmt.Errorf("gone")
					}
					return nil
				}}
				body := fmt.Sprintf(`{"prompt":"shared prefix shared prefix shared prefix %d","max_tokens":%d,"n":%d,"stream":%v,"ignore_eos":%v,"stop":%q}`,
					rng.IntN(4), 1+rng.IntN(60), 1+rng.IntN(3), rng.IntN(2) == 0, rng.IntN(2) == 0, []string{"zz", " the", "q"}[rng.IntN(3)])
				_, err := e.Generate(ctx, &engine.Request{Kind: schemas.KindCompletion, Body: []byte(body)}, sink)
				if err != nil && stopAt != 1 && stopAt != 2 {
					t.Errorf("%s: %v", body, err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	wantStats(t, e, func(s engine.Stats) bool { return s.Running == 0 && s.Waiting == 0 && s.KVCacheUsage == 0 })
	e.Close() // the scheduler is gone: its state can be read
	if e.kv.used != 0 || e.kv.free() != cfg.NumBlocks || len(e.running) != 0 || e.waitingLen() != 0 {
		t.Errorf("kv used %d free %d, running %d waiting %d", e.kv.used, e.kv.free(), len(e.running), e.waitingLen())
	}
	m := e.Metrics()
	if m.PrefixCacheHits == 0 || m.RequestSuccess["abort"] == 0 {
		t.Errorf("metrics %+v", m)
	}
	t.Logf("metrics %+v", m)
}
