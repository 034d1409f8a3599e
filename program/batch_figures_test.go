package program

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/batch"
)

// TestBatchFigures measures what docs/batch.md reports (set
// TOKENBUS_BATCH_FIGURES=1; it takes about a minute): on one sim worker
// with the sim's default timings,
//   - throughput: the same requests as a batch and sent directly at the
//     batch's concurrency, engine otherwise idle;
//   - interactive time to first token, p50 and p90, of streaming requests
//     sent one at a time, with no batch and with a batch running.
func TestBatchFigures(t *testing.T) {
	if os.Getenv("TOKENBUS_BATCH_FIGURES") == "" {
		t.Skip("set TOKENBUS_BATCH_FIGURES=1 to measure (about a minute)")
	}
	const conc, lines, tokens = 64, 2000, 16
	cfg := DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "", "127.0.0.1:-1"
	cfg.SimWorkers = 1
	cfg.Worker.MaxConcurrency = conc
	cfg.HTTP.Batch.MaxInFlight, cfg.HTTP.Batch.MaxPerBatch = conc, conc
	d, err := StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	base := "http://" + d.Addr()
	api := batchAPI{t: t, base: base}
	model := d.Models()[0]
	body := func(i int, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"ignore_eos":true,"stream":%t,"messages":[{"role":"user","content":"q %d"}]}`,
			model, tokens, stream, i)
	}

	// Direct: every request at concurrency conc.
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for range conc {
		wg.Go(func() {
			for i := range next {
				resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body(i, false)))
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("direct %d: %v %v", i, err, resp)
					return
				}
				_ = resp.Body.Close()
			}
		})
	}
	for i := range lines {
		next <- i
	}
	close(next)
	wg.Wait()
	direct := time.Since(start)

	// The same as a batch.
	var in strings.Builder
	for i := range lines {
		fmt.Fprintf(&in, `{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":%s}`+"\n", i, body(i, false))
	}
	f := api.upload("figures.jsonl", []byte(in.String()))
	start = time.Now()
	b := api.create(f.ID, "/v1/chat/completions")
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCompleted })
	batched := time.Since(start)
	t.Logf("throughput, %d requests of %d tokens, concurrency %d: direct %.1f s (%.0f req/s), batch %.1f s (%.0f req/s): batch/direct %.0f %%",
		lines, tokens, conc, direct.Seconds(), lines/direct.Seconds(), batched.Seconds(), lines/batched.Seconds(),
		100*direct.Seconds()/batched.Seconds())

	// Interactive TTFT, alone and beside a batch.
	ttfts := func(n int) []time.Duration {
		var out []time.Duration
		for i := range n {
			start := time.Now()
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body(i, true)))
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("interactive: %v %v", err, resp)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: {") {
					out = append(out, time.Since(start))
					break
				}
			}
			_ = resp.Body.Close()
			time.Sleep(20 * time.Millisecond) // spaced: each one meets a different moment of the batch
		}
		slices.Sort(out)
		return out
	}
	pct := func(d []time.Duration, p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000
	}
	alone := ttfts(100)
	f = api.upload("background.jsonl", []byte(in.String()))
	b = api.create(f.ID, "/v1/chat/completions")
	api.wait(b.ID, func(b batch.Batch) bool { return b.RequestCounts.Completed > conc })
	beside := ttfts(100)
	during := api.wait(b.ID, func(batch.Batch) bool { return true })
	t.Logf("interactive TTFT ms, p50 / p90: alone %.1f / %.1f; beside a batch %.1f / %.1f (ratio p50 %.2f); batch %s %+v when done",
		pct(alone, .5), pct(alone, .9), pct(beside, .5), pct(beside, .9), pct(beside, .5)/pct(alone, .5), during.Status, during.RequestCounts)
	if during.Status != batch.StatusInProgress {
		t.Errorf("the batch ended (%s) before the interactive requests did: the figure is not beside a batch", during.Status)
	}
}
