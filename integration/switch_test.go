package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/program/cli"
	"github.com/tokenbus/tokenbus/schemas"
)

// Models switched on a shared pool (docs/capacity.md#models-switched-on-a-shared-pool):
// one sim worker that can serve two models, one at a time; bursts of
// requests for one model, then the other, each sent while the one before
// still runs. Every request succeeds: those for the model not loaded wait
// held while the dispatcher has the worker switch, and the worker lets the
// running burst finish before it switches. The switches are as many as
// the alternations, each at least the hold after the one before.
func TestModelsSwitchOnASharedPool(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: bursts through six switches")
	}
	t.Parallel()
	const (
		hold   = time.Second
		bursts = 6
		burst  = 20
		tokens = 120 // about 1.2 s a request at the sim's 9-10 ms a token: longer than the hold
	)
	models := [2]string{"alpha", "beta"}
	d := startDev(t, func(c *program.DevConfig) {
		c.SimWorkers = 1
		c.ExampleAdapter = false
		c.Engine.Sim.Models = models[:]
		c.Engine.Sim.SwitchTime = 200 * time.Millisecond
		c.Worker.SwitchHold = hold
		c.Worker.DrainTimeout = 30 * time.Second // the switch waits for the burst: never cut it off
		c.Worker.MaxConcurrency = 64
	})

	// Every heartbeat: when each model was loaded, and whether a switch
	// ever waited for running requests.
	nc := connectNATS(t, d.NATSURL)
	var mu sync.Mutex
	var loads []int64 // distinct LoadedAt values, in order
	drained := false  // a heartbeat said switching with requests running
	sub, err := nc.Subscribe(schemas.HeartbeatPrefix+"*", func(m *nats.Msg) {
		var hb schemas.Heartbeat
		if json.Unmarshal(m.Data, &hb) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if n := len(loads); n == 0 || loads[n-1] != hb.LoadedAt {
			loads = append(loads, hb.LoadedAt)
		}
		if hb.Switching != "" && hb.Running > 0 {
			drained = true
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := openaiClient(d.URL + "/v1")
	type result struct {
		model  string
		tokens int
		err    error
	}
	results := make([][burst]result, bursts)
	var wg sync.WaitGroup
	start := time.Now()
	for b := range bursts {
		model := models[b%2]
		var started sync.WaitGroup
		started.Add(burst)
		for i := range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				once := sync.OnceFunc(started.Done)
				defer once()
				r := &results[b][i]
				st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(tokens),
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("burst %d request %d", b, i))}})
				for st.Next() {
					ch := st.Current()
					if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
						r.tokens++
						once() // running: the next burst may come
					}
					if ch.Model != "" {
						r.model = ch.Model
					}
				}
				r.err = st.Err()
			}()
		}
		// The next burst, for the other model, comes while this one runs.
		started.Wait()
	}
	wg.Wait()
	elapsed := time.Since(start)

	for b := range results {
		for i, r := range results[b] {
			if want := models[b%2]; r.err != nil || r.tokens == 0 || r.model != want {
				t.Errorf("burst %d request %d (%s): model %q, %d tokens, %v", b, i, want, r.model, r.tokens, r.err)
			}
		}
	}
	worker := `worker="dev-worker-1"`
	for _, o := range []string{"error", "cancelled"} {
		if v := metricValue(t, d.URL, `tokenbus_worker_requests_total{outcome="`+o+`",`+worker+`}`); v != 0 {
			t.Errorf("the worker ended %v requests %s: a switch cut them off", v, o)
		}
	}
	switches := 0
	for i, from := range models {
		to := models[1-i]
		switches += int(metricValue(t, d.URL, fmt.Sprintf(`tokenbus_worker_switches_total{from=%q,outcome="ok",to=%q,%s}`, from, to, worker)))
	}
	// One switch per alternation, not more (no thrash), all ok.
	if switches != bursts-1 {
		t.Errorf("%d switches for %d alternations", switches, bursts-1)
	}
	if v := metricValue(t, d.URL, `tokenbus_dispatcher_rejected_total{reason="no_worker"}`); v != 0 {
		t.Errorf("%v requests refused no_worker", v)
	}
	mu.Lock()
	defer mu.Unlock()
	if !drained {
		t.Error("no switch waited for running requests (bursts longer than the hold should have made one)")
	}
	// The hysteresis: each model stayed loaded the hold at least.
	if len(loads) != bursts {
		t.Errorf("%d loads seen (%v), want %d", len(loads), loads, bursts)
	}
	for i := 1; i < len(loads); i++ {
		if gap := time.Duration(loads[i]-loads[i-1]) * time.Millisecond; gap < hold {
			t.Errorf("load %d came %v after the one before, within the hold %v", i, gap, hold)
		}
	}
	t.Logf("%d bursts of %d requests in %v, %d switches (%.1f a minute; the hold allows %.0f)", bursts, burst,
		elapsed.Round(10*time.Millisecond), switches, float64(switches)/elapsed.Minutes(), time.Minute.Seconds()/hold.Seconds())
	testenv.WaitFor(t, 2*time.Second, func() error {
		if v := metricValue(t, d.URL, `tokenbus_dispatcher_switch_requests_total{outcome="accepted"}`); v < bursts-1 {
			return fmt.Errorf("%v switch requests accepted", v)
		}
		return nil
	})
}

// The console's fleet page shows what a worker of several models holds and
// can switch to, that it switches, and the switch once done.
func TestConsoleShowsSwitches(t *testing.T) {
	t.Parallel()
	bin := chromium()
	if bin == "" {
		t.Skip("no chromium binary (apt-get install chromium; scripts/test installs it)")
	}
	d := startDev(t, func(c *program.DevConfig) {
		c.SimWorkers = 1
		c.ExampleAdapter = false
		c.Engine.Sim.Models = []string{"alpha", "beta"}
		c.Engine.Sim.SwitchTime = 2500 * time.Millisecond // the page polls every 2 s: it sees the switch
		c.Worker.SwitchHold = time.Millisecond
	})
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	waitFor := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			t.Fatalf("%s (waiting for %s): %v; page: %.600s", what, expr, err, eval(`document.body.innerText`))
		}
	}
	text := func(id string) string {
		return fmt.Sprintf(`(document.getElementById(%q) || {innerText: ""}).innerText`, id)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(cli.ConsoleURL(d.AdminAddr(), d.AdminToken()))); err != nil {
		t.Fatal(err)
	}
	waitFor("the worker and what it can switch to", text("workers")+`.includes("can switch to beta")`)
	waitFor("no switch yet", text("page-fleet")+`.includes("No model switch yet.")`)

	// A request for beta: held, the worker switches, then it is served.
	c := openaiClient(d.URL + "/v1")
	done := make(chan error, 1)
	go func() {
		_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "beta", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("switch")}})
		done <- err
	}()
	waitFor("switching shown", text("workers")+`.includes("switching to beta")`)
	if err := <-done; err != nil {
		t.Fatalf("the request for beta: %v", err)
	}
	waitFor("the switch done", text("switches")+`.includes("alpha → beta") && `+text("switches")+`.includes("done")`)
	waitFor("beta held now", text("workers")+`.includes("can switch to alpha")`)
	if os.Getenv(screenshotsEnv) == "1" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "docs", "img", "console-switches.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
