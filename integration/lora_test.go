package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// beatLog keeps every heartbeat of every worker, in order.
type beatLog struct {
	mu    sync.Mutex
	beats map[string][]schemas.Heartbeat
}

func logBeats(t *testing.T, natsURL string) *beatLog {
	t.Helper()
	nc := connectNATS(t, natsURL)
	l := &beatLog{beats: map[string][]schemas.Heartbeat{}}
	if _, err := nc.Subscribe(schemas.HeartbeatPrefix+"*", func(m *nats.Msg) {
		var hb schemas.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			l.mu.Lock()
			l.beats[hb.Worker] = append(l.beats[hb.Worker], hb)
			l.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

// loads counts the loads of adapter the workers announced: every worker
// heartbeats at once when a load starts, listing it under Loading.
func (l *beatLog) loads(adapter string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, beats := range l.beats {
		was := false
		for _, hb := range beats {
			is := slices.Contains(hb.Loading, adapter)
			if is && !was {
				n++
			}
			was = is
		}
	}
	return n
}

// holders lists the workers whose last heartbeat has adapter loaded.
func (l *beatLog) holders(adapter string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, beats := range l.beats {
		if len(beats) > 0 && slices.Contains(beats[len(beats)-1].Adapters, adapter) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// TestLoRAAdapters runs `tokenbus dev` on a real Redis holding registered
// LoRA adapters of llama-8b, on two sim workers with one LoRA slot each.
func TestLoRAAdapters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rd, store := startStore(t)
	for _, m := range []registry.Model{
		{Name: "llama-8b-lora", Base: "llama-8b", Path: "sim://loras/llama-8b-lora"},
		{Name: "llama-8b-lora-b", Base: "llama-8b", Path: "sim://loras/b"},
		{Name: "llama-8b-lora-c", Base: "llama-8b", Path: "sim://loras/c"},
		{Name: "llama-8b-lora-d", Base: "llama-8b", Path: "sim://loras/d"},
		{Name: "llama-8b-nopath", Base: "llama-8b"},
		{Name: "mistral-lora", Base: "mistral-7b", Path: "sim://loras/mistral"},
	} {
		if err := store.PutModel(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// A load takes long enough for its heartbeat (Loading) to be seen.
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL, c.SimWorkers, c.Engine.Sim.MaxLoras = rd.URL, 2, 1
		c.Engine.Sim.AdapterLoadTime, c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = 300*time.Millisecond, time.Millisecond, time.Millisecond
	})
	beats := logBeats(t, d.NATSURL)
	routed := func(placement string) float64 {
		return max(0, metricValue(t, d.URL, `tokenbus_dispatcher_adapter_routed_total{placement="`+placement+`"}`))
	}

	// The seed's example: TorchServe's path names the adapter.
	s := post(t, d.URL, "/predictions/llama-8b-lora/1.0/v1/completions", `{"prompt":"Once upon a time","max_tokens":8,"stream":true}`)
	if s.Status != 200 || len(s.Events) < 2 || s.Events[len(s.Events)-1] != "[DONE]" ||
		!strings.Contains(s.Events[0], `"model":"llama-8b-lora"`) {
		t.Fatalf("seed example: status %d events %v body %s", s.Status, s.Events, s.Body)
	}
	if s.Elapsed < 300*time.Millisecond {
		t.Errorf("the first request took %v: it should include the adapter's load", s.Elapsed)
	}
	holders := beats.holders("llama-8b-lora")
	testenv.WaitFor(t, 5*time.Second, func() error {
		if holders = beats.holders("llama-8b-lora"); len(holders) != 1 || beats.loads("llama-8b-lora") != 1 {
			return fmt.Errorf("holders %v, loads %d: want one worker to have loaded it once", holders, beats.loads("llama-8b-lora"))
		}
		return nil
	})

	// The official SDK streams from it; the second request goes to the
	// worker holding it and loads nothing.
	c := openaiClient(d.URL + "/v1")
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:     "llama-8b-lora",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		MaxTokens: openai.Int(10),
	})
	acc := openai.ChatCompletionAccumulator{}
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Model != "llama-8b-lora" || acc.Choices[0].Message.Content == "" || acc.Choices[0].FinishReason == "" {
		t.Fatalf("stream from the adapter: %+v", acc.ChatCompletion)
	}
	if n := beats.loads("llama-8b-lora"); n != 1 {
		t.Fatalf("the second request caused another load: %d loads", n)
	}
	if free, holder := routed("free_slot"), routed("holder"); free != 1 || holder != 1 {
		t.Fatalf("routed: free_slot %v holder %v, want 1 and 1", free, holder)
	}
	if got := beats.holders("llama-8b-lora"); !slices.Equal(got, holders) {
		t.Fatalf("holders %v, was %v", got, holders)
	}

	// The base model is served as before.
	s = post(t, d.URL, "/v1/completions", `{"model":"llama-8b","prompt":"hi","max_tokens":4}`)
	if s.Status != 200 || !strings.Contains(s.Body, `"model":"llama-8b"`) {
		t.Fatalf("base model: %d %s", s.Status, s.Body)
	}

	// A second adapter takes the other worker's free slot; a third finds
	// every slot full and evicts one.
	complete := func(model string) {
		t.Helper()
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(model),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")},
			MaxTokens: openai.Int(4),
		})
		if err != nil || resp.Model != model || resp.Choices[0].Text == "" {
			t.Fatalf("%s: %+v %v", model, resp, err)
		}
	}
	complete("llama-8b-lora-b")
	testenv.WaitFor(t, 5*time.Second, func() error {
		if got := beats.holders("llama-8b-lora-b"); len(got) != 1 || slices.Equal(got, holders) {
			return fmt.Errorf("b held by %v; llama-8b-lora by %v: want the other worker", got, holders)
		}
		return nil
	})
	complete("llama-8b-lora-c")
	if free, evict := routed("free_slot"), routed("evict"); free != 2 || evict != 1 {
		t.Fatalf("routed: free_slot %v evict %v, want 2 and 1", free, evict)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		a, b, c := beats.holders("llama-8b-lora"), beats.holders("llama-8b-lora-b"), beats.holders("llama-8b-lora-c")
		if len(c) != 1 || len(a)+len(b) != 1 {
			return fmt.Errorf("holders: lora %v, b %v, c %v: want c on one worker, one of the others evicted", a, b, c)
		}
		return nil
	})

	// Concurrent first requests for an adapter nobody has cause one load.
	const burst = 6
	errs := make(chan error, burst)
	for range burst {
		go func() {
			resp, err := httpClient.Post(d.URL+"/v1/completions", "application/json",
				strings.NewReader(`{"model":"llama-8b-lora-d","prompt":"hi","max_tokens":4}`))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			errs <- err
		}()
	}
	for range burst {
		if err := <-errs; err != nil {
			t.Fatalf("burst: %v", err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if got := beats.holders("llama-8b-lora-d"); len(got) != 1 {
			return fmt.Errorf("d held by %v", got)
		}
		return nil
	})
	if n := beats.loads("llama-8b-lora-d"); n != 1 {
		t.Fatalf("%d concurrent first requests caused %d loads, want 1", burst, n)
	}

	// Clear errors: an adapter whose load fails (no path registered) and an
	// adapter whose base model no worker serves.
	s = post(t, d.URL, "/v1/completions", `{"model":"llama-8b-nopath","prompt":"hi","max_tokens":4}`)
	if e := errorBody(t, s.Body); s.Status != 500 || e.Code == nil || *e.Code != schemas.CodeAdapterLoadFailed ||
		!strings.Contains(e.Message, "llama-8b-nopath") {
		t.Fatalf("adapter that cannot load: %d %s", s.Status, s.Body)
	}
	s = post(t, d.URL, "/v1/completions", `{"model":"mistral-lora","prompt":"hi","max_tokens":4}`)
	if e := errorBody(t, s.Body); s.Status != 503 || e.Code == nil || *e.Code != schemas.CodeNoWorker ||
		!strings.Contains(e.Message, "mistral-7b") {
		t.Fatalf("adapter without a base worker: %d %s", s.Status, s.Body)
	}
}
