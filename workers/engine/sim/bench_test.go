package sim

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

type discardSink struct{ bytes int }

func (s *discardSink) Chunks(b []byte) error { s.bytes += len(b); return nil }

// BenchmarkStream measures the engine's own cost per streamed token with all
// timings zero: one op is one streaming chat request of 256 tokens;
// streams=N runs N of them at once so that the batch has N sequences.
func BenchmarkStream(b *testing.B) {
	const tokens = 256
	for _, streams := range []int{1, 64} {
		b.Run("streams="+itoa(streams), func(b *testing.B) {
			e := newEngine(b, fastConfig())
			body := []byte(`{"model":"sim","messages":[{"role":"user","content":"Tell me a story."}],"stream":true,"max_tokens":256,"ignore_eos":true}`)
			run := func(n int) {
				var wg sync.WaitGroup
				per := (n + streams - 1) / streams
				for w := 0; w < streams; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sink := &discardSink{}
						for i := 0; i < per; i++ {
							req := &engine.Request{ID: "bench", Kind: schemas.KindChat, Body: body}
							res, err := e.Generate(context.Background(), req, sink)
							if err != nil || res.Usage.CompletionTokens != tokens {
								b.Errorf("%v %+v", err, res)
								return
							}
						}
					}()
				}
				wg.Wait()
			}
			run(streams) // warm up
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			b.ResetTimer()
			start := time.Now()
			run(b.N)
			elapsed := time.Since(start)
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			per := (b.N + streams - 1) / streams
			total := float64(per * streams * tokens)
			b.ReportMetric(float64(elapsed.Nanoseconds())/total, "ns/token")
			b.ReportMetric(total/elapsed.Seconds(), "tokens/s")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/total, "allocs/token")
			b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/total, "B/token")
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// Streaming allocates per request, never per token.
func TestNoPerTokenAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	e := newEngine(t, fastConfig())
	sink := &discardSink{}
	allocs := func(tokens int) float64 {
		body := []byte(`{"messages":[{"role":"user","content":"Hi"}],"stream":true,"ignore_eos":true,"max_tokens":` + itoa(tokens) + `}`)
		return testing.AllocsPerRun(20, func() {
			if _, err := e.Generate(context.Background(), &engine.Request{Kind: schemas.KindChat, Body: body}, sink); err != nil {
				t.Fatal(err)
			}
		})
	}
	short, long := allocs(64), allocs(2048)
	if long-short > 3 {
		t.Errorf("%v allocations for 64 tokens, %v for 2048", short, long)
	}
	t.Logf("allocations per request: %v for 64 tokens, %v for 2048", short, long)
}
