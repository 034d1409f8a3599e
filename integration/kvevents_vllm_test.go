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

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// kvWatch gathers the workers' KV events messages from NATS.
type kvWatch struct {
	mu   sync.Mutex
	msgs []schemas.KVEvents
}

func watchKVEvents(t *testing.T, natsURL string) *kvWatch {
	t.Helper()
	nc := connectNATS(t, natsURL)
	w := &kvWatch{}
	if _, err := nc.Subscribe(schemas.KVEventsPrefix+">", func(m *nats.Msg) {
		var ev schemas.KVEvents
		if json.Unmarshal(m.Data, &ev) == nil {
			w.mu.Lock()
			w.msgs = append(w.msgs, ev)
			w.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// find returns the messages seen so far that satisfy ok, and how many were seen.
func (w *kvWatch) find(ok func(schemas.KVEvents) bool) (found bool, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.msgs {
		if ok(m) {
			found = true
		}
	}
	return found, len(w.msgs)
}

// TestVLLMKVEvents: a worker with --engine vllm in front of a sim-server that
// publishes vLLM's KV cache events (--kv-events-config, ZMQ) maps them to the
// dispatchers' text hashes: a prompt stored is reported under the hashes the
// dispatcher routes it by, its eviction removes them from the dispatcher's
// record (the next request is predicted less cached), and a restart of the
// engine reports a loss, which clears the record.
func TestVLLMKVEvents(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	ss := startSimServer(t, func(c *program.SimServerConfig) {
		c.KVEvents = fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%d","topic":"kv-events"}`, port)
		c.Sim.NumBlocks, c.Sim.MaxModelLen = 70, 1024 // 1120 tokens: the third prompt of about 450 evicts the first
	})
	d := startDev(t, vllmEngine(ss.URL()), func(c *program.DevConfig) {
		c.Engine.KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	})
	kv := watchKVEvents(t, d.NATSURL)

	body := func(topic string) string {
		return fmt.Sprintf(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"ignore_eos":true,`+
			`"messages":[{"role":"system","content":%q}]}`, strings.Repeat(topic+" tell me more about the weather today please ", 50))
	}
	textOf := func(b string) []uint64 {
		return schemas.PromptBlockHashes(nil, "llama-8b", schemas.PromptSpan([]byte(b)), 64)
	}
	send := func(b string) {
		t.Helper()
		checkStream(t, post(t, d.URL, "/v1/chat/completions", b), true, 1, true)
	}
	compared := uint64(0)
	predicted := func() float64 { // cached tokens predicted so far, once the request just sent is counted
		t.Helper()
		compared++
		testenv.WaitFor(t, 5*time.Second, func() error {
			if _, _, n := prefixCounts(t, d.URL); n != compared {
				return fmt.Errorf("%d requests compared, want %d", n, compared)
			}
			return nil
		})
		p, _, _ := prefixCounts(t, d.URL)
		return p
	}
	// The dispatcher has applied every KV events message seen on NATS.
	applied := func() {
		t.Helper()
		testenv.WaitFor(t, 5*time.Second, func() error {
			_, n := kv.find(func(schemas.KVEvents) bool { return false })
			if got := metricValue(t, d.URL, "tokenbus_dispatcher_kv_events_total"); got < float64(n) {
				return fmt.Errorf("dispatcher applied %v KV events messages, %d published", got, n)
			}
			return nil
		})
	}

	// 1. A prompt stored: its text hashes, as the dispatcher computes them.
	a := body("alpha")
	ta := textOf(a)
	send(a)
	p1 := predicted()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if ok, _ := kv.find(func(ev schemas.KVEvents) bool {
			for _, c := range ev.Stored {
				if len(c) >= len(ta)-2 && slices.Equal(c, ta[:len(c)]) {
					return true
				}
			}
			return false
		}); !ok {
			return fmt.Errorf("no stored chain of the prompt's %d text blocks", len(ta))
		}
		return nil
	})
	send(a)
	p2 := predicted() - p1

	// 2. Two other long prompts evict the first one's tail.
	send(body("beta"))
	predicted()
	send(body("gamma"))
	predicted()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if ok, _ := kv.find(func(ev schemas.KVEvents) bool {
			return slices.ContainsFunc(ev.Removed, func(h uint64) bool { return slices.Contains(ta, h) })
		}); !ok {
			return fmt.Errorf("no eviction of the first prompt's blocks reported")
		}
		return nil
	})
	applied()
	total, _, _ := prefixCounts(t, d.URL)
	send(a)
	p3 := predicted() - total
	t.Logf("cached tokens predicted for the prompt: %v first, %v repeated, %v after its eviction", p1, p2, p3)
	if p1 != 0 || p2 < 400 || p3 >= p2 {
		t.Errorf("predicted %v, %v, %v: want 0, then most of the prompt, then less after the eviction", p1, p2, p3)
	}

	// 3. The engine restarts: the events are lost, the record cleared.
	ss.kill()
	ss.start()
	testenv.WaitFor(t, 15*time.Second, func() error {
		if ok, _ := kv.find(func(ev schemas.KVEvents) bool { return ev.Dropped > 0 }); !ok {
			return fmt.Errorf("no loss reported after the engine's restart")
		}
		return nil
	})
	applied()
	waitReady(t, d.URL)
	total, _, _ = prefixCounts(t, d.URL)
	send(a)
	if p4 := predicted() - total; p4 != 0 {
		t.Errorf("after the engine's restart: predicted %v cached tokens, want 0 (record cleared)", p4)
	}
}

// TestVLLMKVEventsAuto: with --engine-kv-events auto the worker adds
// --kv-events-config to the child engine's command line and follows its
// events; a completion prompt (a string) is mapped too.
func TestVLLMKVEventsAuto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and runs it as vLLM")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	cmd := fmt.Sprintf("%s sim-server --port %d --model llama-8b --sim-decode-base 1ms", bin, testenv.FreePort(t))
	d := startDev(t, vllmEngine(""), func(c *program.DevConfig) {
		c.Engine.VLLMCmd, c.Engine.StartTimeout, c.Engine.KVEvents = cmd, 30*time.Second, "auto"
	})
	kv := watchKVEvents(t, d.NATSURL)
	body := fmt.Sprintf(`{"model":"llama-8b","max_tokens":2,"prompt":%q}`, strings.Repeat("the quick brown fox jumps over the lazy dog ", 30))
	text := schemas.PromptBlockHashes(nil, "llama-8b", schemas.PromptSpan([]byte(body)), 64)
	if s := post(t, d.URL, "/v1/completions", body); s.Status != 200 {
		t.Fatalf("status %d: %s", s.Status, s.Body)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		if ok, _ := kv.find(func(ev schemas.KVEvents) bool {
			return slices.ContainsFunc(ev.Stored, func(c []uint64) bool { return len(c) >= len(text)-2 && slices.Equal(c, text[:len(c)]) })
		}); !ok {
			return fmt.Errorf("no stored chain of the prompt's %d text blocks", len(text))
		}
		return nil
	})
}

// TestVLLMKVEventsLoRA: an adapter's prompt is reported under the text
// hashes rooted at the adapter's name, as dispatchers key it: the worker ties
// vLLM's lora_name in the events to the request's adapter.
func TestVLLMKVEventsLoRA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rd, store := startStore(t)
	if err := store.PutModel(ctx, registry.Model{Name: "lora-a", Base: "llama-8b", Path: "/adapters/lora-a"}); err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	ss := startSimServer(t, func(c *program.SimServerConfig) {
		c.KVEvents = fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%d","topic":"kv-events"}`, port)
	})
	d := startDev(t, vllmEngine(ss.URL()), func(c *program.DevConfig) {
		c.Redis.URL, c.Engine.KVEvents = rd.URL, fmt.Sprintf("tcp://127.0.0.1:%d", port)
	})
	kv := watchKVEvents(t, d.NATSURL)
	chain := func(model string) func(schemas.KVEvents) bool {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]}`,
			model, strings.Repeat("an adapter's own prompt, long enough for many blocks ", 20))
		text := schemas.PromptBlockHashes(nil, model, schemas.PromptSpan([]byte(body)), 64)
		if s := post(t, d.URL, "/v1/chat/completions", body); s.Status != 200 {
			t.Fatalf("%s: status %d: %s", model, s.Status, s.Body)
		}
		return func(ev schemas.KVEvents) bool {
			return slices.ContainsFunc(ev.Stored, func(c []uint64) bool { return len(c) >= len(text)-2 && slices.Equal(c, text[:len(c)]) })
		}
	}
	for _, model := range []string{"lora-a", "llama-8b"} { // the same text: apart in vLLM's cache and in the dispatchers'
		found := chain(model)
		testenv.WaitFor(t, 10*time.Second, func() error {
			if ok, _ := kv.find(found); !ok {
				return fmt.Errorf("%s: no stored chain of the prompt under its hashes", model)
			}
			return nil
		})
	}
}
