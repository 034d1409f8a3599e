package program

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// failoverFleet is a dispatcher, three sim workers (w1..w3, 10 ms a token)
// and a gateway routing through that dispatcher, as `tokenbus dev
// --sim-workers 0` with three `tokenbus worker`s, on ns.
func failoverFleet(t *testing.T, ns *server.Server) (*Dispatcher, []*Worker, *Gateway) {
	t.Helper()
	ctx := context.Background()
	dc := DefaultDispatcher()
	dc.NATS.URL, dc.Redis.URL = ns.ClientURL(), ""
	disp, err := StartDispatcher(ctx, dc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = disp.Close() })
	var ws []*Worker
	for i := 1; i <= 3; i++ {
		wc := DefaultWorker()
		wc.NATS.URL, wc.Worker.ID = ns.ClientURL(), fmt.Sprintf("w%d", i)
		wc.Engine.Sim.DecodeBase, wc.Engine.Sim.PrefillBase = 10*time.Millisecond, time.Millisecond
		w, err := StartWorker(ctx, wc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		ws = append(ws, w)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := disp.run().d.Fleet().Len(); n != 3 {
			return fmt.Errorf("the dispatcher knows %d workers", n)
		}
		return nil
	})
	gc := DefaultGateway()
	gc.NATS.URL, gc.Redis.URL = ns.ClientURL(), ""
	gc.HTTP.Listen, gc.HTTP.Auth, gc.HTTP.Admin = "127.0.0.1:0", false, ""
	gw, err := startGateway(ctx, gc, host{dispatcher: func() *dispatcher.Dispatcher { return disp.run().d }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return disp, ws, gw
}

// kill takes the busiest live worker off the bus abruptly (its NATS
// connection closed, nothing drained: as kill -9 looks to the others) and
// returns it. Its engine generates on for nobody.
func kill(t *testing.T, ws []*Worker, dead map[string]bool) *Worker {
	t.Helper()
	var victim *Worker
	for _, w := range ws {
		if !dead[w.ID()] && (victim == nil || w.eng.Stats().Running > victim.eng.Stats().Running) {
			victim = w
		}
	}
	if victim.eng.Stats().Running == 0 {
		t.Fatal("no worker has streams to lose")
	}
	dead[victim.ID()] = true
	victim.run().nc.Close()
	return victim
}

// streamResult is what a client saw of one stream.
type streamResult struct {
	ids        map[string]bool
	text       string
	tokens     int // chunks with text
	usage      schemas.Usage
	finish     string
	err        error
	progressed atomic.Int32
	last       time.Time     // when the last token came
	maxGap     time.Duration // the longest wait between two tokens: the stall a migration caused
}

// tick counts a token and the wait since the one before.
func (r *streamResult) tick() {
	now := time.Now()
	if !r.last.IsZero() {
		r.maxGap = max(r.maxGap, now.Sub(r.last))
	}
	r.last = now
	r.tokens++
	r.progressed.Add(1)
}

// Thirty streams of 100 tokens (ignore_eos) through the gateway with
// openai-go, half chat, half completions; once every one has tokens, the
// busiest worker is killed (its connection closed, no goodbye) and the
// gateway's fleet notices. Every stream still ends well: exactly 100
// tokens, one id, the same text as every other stream of its kind (the
// sim's output is a function of the prompt: a migrated stream lost or
// repeated nothing), usage of the whole completion; the migrations are
// counted.
func TestMigrationEndToEnd(t *testing.T) {
	ns := testenv.NATS(t)
	_, ws, gw := failoverFleet(t, ns)
	oc := openai.NewClient(option.WithBaseURL("http://"+gw.Addr()+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const n, tokens = 30, 100
	res := make([]*streamResult, n)
	var wg sync.WaitGroup
	for i := range n {
		r := &streamResult{ids: map[string]bool{}}
		res[i] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			ignoreEOS := option.WithJSONSet("ignore_eos", true)
			if i%2 == 0 {
				st := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
					Model:         "llama-8b",
					Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story")},
					MaxTokens:     openai.Int(tokens),
					StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
				}, ignoreEOS)
				for st.Next() {
					ch := st.Current()
					r.ids[ch.ID] = true
					for _, c := range ch.Choices {
						if c.Delta.Content != "" {
							r.text += c.Delta.Content
							r.tick()
						}
						if c.FinishReason != "" {
							r.finish = c.FinishReason
						}
					}
					if ch.Usage.TotalTokens > 0 {
						r.usage = schemas.Usage{PromptTokens: int(ch.Usage.PromptTokens), CompletionTokens: int(ch.Usage.CompletionTokens), TotalTokens: int(ch.Usage.TotalTokens)}
					}
				}
				r.err = st.Err()
				return
			}
			st := oc.Completions.NewStreaming(ctx, openai.CompletionNewParams{
				Model:         openai.CompletionNewParamsModel("llama-8b"),
				Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
				MaxTokens:     openai.Int(tokens),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			}, ignoreEOS)
			for st.Next() {
				ch := st.Current()
				r.ids[ch.ID] = true
				for _, c := range ch.Choices {
					if c.Text != "" {
						r.text += c.Text
						r.tick()
					}
					if c.FinishReason != "" {
						r.finish = string(c.FinishReason)
					}
				}
				if ch.Usage.TotalTokens > 0 {
					r.usage = schemas.Usage{PromptTokens: int(ch.Usage.PromptTokens), CompletionTokens: int(ch.Usage.CompletionTokens), TotalTokens: int(ch.Usage.TotalTokens)}
				}
			}
			r.err = st.Err()
		}()
	}
	testenv.WaitFor(t, 20*time.Second, func() error {
		for i, r := range res {
			if r.progressed.Load() < 5 {
				return fmt.Errorf("stream %d has %d tokens", i, r.progressed.Load())
			}
		}
		return nil
	})
	victim := kill(t, ws, map[string]bool{})
	lost := victim.eng.Stats().Running
	// No hint: the gateway's fleet notices the dead worker (missed
	// heartbeats) and its streams migrate.
	wg.Wait()

	checkStreams(t, res, tokens)
	var stall time.Duration
	for _, r := range res {
		stall = max(stall, r.maxGap)
	}
	t.Logf("longest wait between two tokens of a stream: %v", stall)
	if stall > 2*time.Second {
		t.Errorf("a stream stalled %v across the worker's death, want ≤ 2s", stall)
	}
	body := get200(t, "http://"+gw.Addr()+"/metrics")
	if !strings.Contains(body, `tokenbus_client_migrations_total{reason="worker_lost"}`) {
		t.Fatalf("no migration counted (%d streams were on %s):\n%s", lost, victim.ID(), grepLines(body, "tokenbus_client_"))
	}
	t.Logf("%d streams were on %s when it was killed; %s", lost, victim.ID(), grepLines(body, "tokenbus_client_"))
}

// checkStreams: every stream ended well with exactly tokens tokens, one id,
// and the text of every other stream of its kind (even: chat, odd:
// completions).
func checkStreams(t *testing.T, res []*streamResult, tokens int) {
	t.Helper()
	for i, r := range res {
		ref := res[i%2]
		switch {
		case r.err != nil:
			t.Errorf("stream %d failed: %v", i, r.err)
		case r.tokens != tokens || r.usage.CompletionTokens != tokens || r.finish != "length":
			t.Errorf("stream %d: %d tokens, usage %+v, finish %q; want %d", i, r.tokens, r.usage, r.finish, tokens)
		case len(r.ids) != 1:
			t.Errorf("stream %d has ids %v", i, r.ids)
		case r.text != ref.text || r.usage.PromptTokens != ref.usage.PromptTokens || r.usage.TotalTokens != ref.usage.TotalTokens || r.usage.PromptTokens == 0:
			t.Errorf("stream %d: text %q usage %+v\nwant text %q usage %+v", i, r.text, r.usage, ref.text, ref.usage)
		}
	}
}

func get200(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// A NATS-native Go client (the client package, through the standalone
// dispatcher) gets the same: its streams survive the loss of a worker.
func TestMigrationNATSNative(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	ns := testenv.NATS(t)
	_, ws, _ := failoverFleet(t, ns)
	nc := testenv.Connect(t, ns)
	var migrations atomic.Int32
	cl, err := client.New(nc, client.Options{OnFailover: func(ev client.Failover) {
		if ev.Kind == client.FailoverMigration {
			migrations.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// What a NATS-native program does to fail over within a second: watch
	// the workers' heartbeats and tell the client which ones die.
	workers := fleet.New()
	if err := fleet.Watch(ctx, nc, workers); err != nil {
		t.Fatal(err)
	}
	workers.OnGone(cl.WorkerLost)
	testenv.WaitFor(t, 10*time.Second, func() error {
		if workers.Len() != len(ws) {
			return fmt.Errorf("%d workers seen", workers.Len())
		}
		return nil
	})

	const n, tokens = 12, 100
	res := make([]*streamResult, n)
	var wg sync.WaitGroup
	for i := range n {
		r := &streamResult{ids: map[string]bool{}}
		res[i] = r
		kind, body := schemas.KindChat, `{"model":"llama-8b","stream":true,"max_tokens":100,"ignore_eos":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me a story"}]}`
		if i%2 == 1 {
			kind, body = schemas.KindCompletion, `{"model":"llama-8b","stream":true,"max_tokens":100,"ignore_eos":true,"prompt":"Once upon a time"}`
		}
		st, err := cl.Start(&client.Request{ID: fmt.Sprintf("native-%d", i), Kind: kind, Model: "llama-8b", Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				f, err := st.Next(ctx)
				if err != nil {
					r.err = err
					return
				}
				if f.Type == schemas.FrameDone {
					if u := schemas.UsageOf(f.Payload); u != nil {
						r.usage = *u
					}
					return
				}
				_ = schemas.ForEachLine(f.Payload, func(line []byte) error {
					var ch struct {
						ID      string `json:"id"`
						Choices []struct {
							Text         string                   `json:"text"`
							Delta        struct{ Content string } `json:"delta"`
							FinishReason *string                  `json:"finish_reason"`
						} `json:"choices"`
					}
					if err := json.Unmarshal(line, &ch); err != nil {
						return err
					}
					r.ids[ch.ID] = true
					for _, c := range ch.Choices {
						if s := c.Text + c.Delta.Content; s != "" {
							r.text += s
							r.tick()
						}
						if c.FinishReason != nil {
							r.finish = *c.FinishReason
						}
					}
					return nil
				})
			}
		}()
	}
	testenv.WaitFor(t, 20*time.Second, func() error {
		for i, r := range res {
			if r.progressed.Load() < 5 {
				return fmt.Errorf("stream %d has %d tokens", i, r.progressed.Load())
			}
		}
		return nil
	})
	victim := kill(t, ws, map[string]bool{})
	lost := victim.eng.Stats().Running
	wg.Wait()
	checkStreams(t, res, tokens)
	if migrations.Load() == 0 {
		t.Fatalf("no stream migrated (%d were on %s)", lost, victim.ID())
	}
	t.Logf("%d streams migrated off %s", migrations.Load(), victim.ID())
}
