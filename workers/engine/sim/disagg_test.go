package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// kvConfig is fastConfig with a short hold and no transfer time.
func kvConfig() Config {
	c := fastConfig()
	c.KVTransferBase, c.KVTransferPerToken = 0, 0
	return c
}

const pdChat = `{"model":"sim","messages":[{"role":"user","content":"Tell me a story about a lighthouse keeper and the sea, in a few lines."}],"max_tokens":24,"ignore_eos":true}`

// prefillRun sends body to e as a worker's prefill (schemas.PrefillBody)
// and returns the answer and its kv_transfer_params.
func prefillRun(t testing.TB, e *Engine, kind schemas.Kind, body string) (*engine.Result, []byte) {
	t.Helper()
	pb, ok := schemas.PrefillBody([]byte(body))
	if !ok {
		t.Fatalf("PrefillBody(%s)", body)
	}
	res := mustGen(t, e, kind, string(pb), nil)
	return res, schemas.TransferParamsOf(res.Response)
}

// decodeRun sends body with params to e as a worker's decode.
func decodeRun(e *Engine, kind schemas.Kind, body string, params []byte, sink engine.Sink) (*engine.Result, error) {
	db, ok := schemas.DecodeBody([]byte(body), params)
	if !ok {
		return nil, fmt.Errorf("DecodeBody(%s)", body)
	}
	return e.Generate(context.Background(), &engine.Request{ID: "dec", Kind: kind, Body: db}, sink)
}

func setParam(t testing.TB, params []byte, name string, v any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(params, &m); err != nil {
		t.Fatal(err)
	}
	m[name] = v
	b, _ := json.Marshal(m)
	return b
}

func TestPrefillAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind schemas.Kind
		body string
	}{
		{"chat", schemas.KindChat, pdChat},
		{"chat max_completion_tokens", schemas.KindChat, `{"messages":[{"role":"user","content":"Hello there, how are you?"}],"max_completion_tokens":50,"stream":true,"stream_options":{"include_usage":true}}`},
		{"completion", schemas.KindCompletion, `{"model":"sim","prompt":"Once upon a time, in a land far away, there lived a king who","max_tokens":30}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, kvConfig())
			res, params := prefillRun(t, e, tc.kind, tc.body)
			if params == nil {
				t.Fatalf("no kv_transfer_params in %s", res.Response)
			}
			// The members, in vLLM's order, and nothing else.
			dec := json.NewDecoder(bytes.NewReader(params))
			var keys []string
			dec.Token()
			for dec.More() {
				k, _ := dec.Token()
				keys = append(keys, k.(string))
				var skip json.RawMessage
				dec.Decode(&skip)
			}
			want := []string{"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
				"remote_request_id", "remote_host", "remote_port", "tp_size"}
			if !slices.Equal(keys, want) {
				t.Fatalf("members %q, want %q", keys, want)
			}
			var p struct {
				DoRemotePrefill bool   `json:"do_remote_prefill"`
				DoRemoteDecode  bool   `json:"do_remote_decode"`
				BlockIDs        []int  `json:"remote_block_ids"`
				EngineID        string `json:"remote_engine_id"`
				RequestID       string `json:"remote_request_id"`
				Host            string `json:"remote_host"`
				Port            int    `json:"remote_port"`
				TPSize          int    `json:"tp_size"`
			}
			decodeStrict(t, params, &p)
			st := e.KVTransferStats()
			var u struct {
				Object  string `json:"object"`
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage schemas.Usage `json:"usage"`
			}
			json.Unmarshal(res.Response, &u)
			prompt := u.Usage.PromptTokens
			blocks := (prompt + 15) / 16
			if !p.DoRemotePrefill || p.DoRemoteDecode || len(p.BlockIDs) != blocks || p.EngineID != e.EngineID() ||
				p.RequestID == "" || p.Host != "127.0.0.1" || p.TPSize != 1 ||
				net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) != st.Addr {
				t.Fatalf("params %s (prompt %d tokens, stats %+v)", params, prompt, st)
			}
			if u.Usage.CompletionTokens != 1 || len(u.Choices) != 1 || u.Choices[0].FinishReason != "length" {
				t.Fatalf("answer %s", res.Response)
			}
			// The prompt's blocks are held: in use, counted.
			if st.Prefills != 1 || st.HeldRequests != 1 || st.HeldBlocks != blocks {
				t.Fatalf("stats %+v, want %d blocks held", st, blocks)
			}
			if got, want := e.Stats().KVCacheUsage, float64(blocks)/float64(e.cfg.NumBlocks); got != want {
				t.Fatalf("KV cache usage %v, want %v", got, want)
			}
		})
	}
}

func TestPrefillHoldsNothing(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		// A stream's answer cannot carry the params: nothing is held.
		{"stream", `{"messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`},
		// A prefill that stops on its first token (vLLM: not FINISHED_LENGTH_CAPPED) holds nothing.
		{"stopped", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"stop":["` + firstWord(t) + `"],"kv_transfer_params":{"do_remote_decode":true}}`},
		{"no params", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"kv_transfer_params":null}`},
		{"decode false", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"kv_transfer_params":{"do_remote_decode":false,"x":1}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, kvConfig())
			res, err := gen(t, e, schemas.KindChat, tc.body, &recSink{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Response != nil && schemas.TransferParamsOf(res.Response) != nil {
				t.Fatalf("params in %s", res.Response)
			}
			if tc.name == "stopped" && !bytes.Contains(res.Response, []byte(`"kv_transfer_params":null`)) {
				t.Fatalf("answer %s, want kv_transfer_params null", res.Response)
			}
			wantStats(t, e, func(st engine.Stats) bool { return st.KVCacheUsage == 0 })
			if st := e.KVTransferStats(); st.HeldBlocks != 0 || st.Prefills != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// firstWord is the sim's first token for the prompt "Hi".
func firstWord(t *testing.T) string {
	e := newEngine(t, kvConfig())
	a := chatAnswer(t, e, `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}`)
	return strings.TrimSpace(a.content)
}

// TestDecodeTakesPrefill: a decode engine takes a prefill engine's blocks
// and answers exactly as an aggregated run; KV accounting on both sides.
func TestDecodeTakesPrefill(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p, d, agg := newEngine(t, kvConfig()), newEngine(t, kvConfig()), newEngine(t, kvConfig())
			body := pdChat
			if stream {
				body = strings.Replace(body, `"max_tokens"`, `"stream":true,"stream_options":{"include_usage":true},"max_tokens"`, 1)
			}
			_, params := prefillRun(t, p, schemas.KindChat, body)
			held := p.KVTransferStats().HeldBlocks

			var want, got answer
			if stream {
				want = chatStream(t, agg, body)
				db, _ := schemas.DecodeBody([]byte(body), params)
				got = chatStream(t, d, string(db))
			} else {
				want = chatAnswer(t, agg, body)
				db, _ := schemas.DecodeBody([]byte(body), params)
				got = chatAnswer(t, d, string(db))
			}
			if got.content != want.content || got.usage.PromptTokens != want.usage.PromptTokens ||
				got.usage.CompletionTokens != want.usage.CompletionTokens {
				t.Fatalf("decode %+v, aggregated %+v", got, want)
			}
			prompt := want.usage.PromptTokens
			if c := got.usage.PromptTokensDetails; c == nil || c.CachedTokens != prompt {
				t.Fatalf("cached tokens %+v, want the %d transferred", c, prompt)
			}
			// Prefill side: the hold is gone, its blocks freed.
			wantStats(t, p, func(st engine.Stats) bool { return st.KVCacheUsage == 0 })
			ps := p.KVTransferStats()
			if ps.Pulls != 1 || ps.HeldBlocks != 0 || ps.HeldRequests != 0 || ps.PullsRefused != 0 {
				t.Fatalf("prefill stats %+v", ps)
			}
			// Decode side: taken, counted; its own blocks allocated and now
			// cached (the prompt is in its prefix cache).
			ds := d.KVTransferStats()
			if ds.RemotePrefills != 1 || ds.Failed != 0 || ds.TransferredTokens != uint64(prompt) {
				t.Fatalf("decode stats %+v", ds)
			}
			m := d.Metrics()
			if m.PromptTokens != uint64(prompt) || m.PrefixCacheHits != 0 {
				t.Fatalf("decode metrics %+v", m)
			}
			if again := chatAnswer(t, d, pdChat); again.usage.PromptTokensDetails.CachedTokens != (held-1)*16 {
				t.Fatalf("the decode engine's cache: %+v, want %d cached", again.usage, (held-1)*16)
			}
		})
	}
}

// TestTransferRefused: a decode engine that cannot take the blocks fails
// with kv_transfer_failed before anything is streamed, and the prefill
// engine keeps what it holds for the right decode.
func TestTransferRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hold   time.Duration
		spoil  func(t *testing.T, p *Engine, params []byte) []byte
		body   string // the decode's, default pdChat
		reason string
		kept   bool // the prefill engine still holds the blocks
	}{
		{name: "expired", hold: 20 * time.Millisecond, reason: "expired", spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			testenv.WaitFor(t, 5*time.Second, func() error {
				if st := p.KVTransferStats(); st.Expired != 1 || st.HeldBlocks != 0 {
					return fmt.Errorf("stats %+v", st)
				}
				return nil
			})
			return params
		}},
		{name: "engine restarted", reason: "restarted", kept: true, spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			return setParam(t, params, "remote_engine_id", "0b9e2b36-0000-4000-8000-000000000000")
		}},
		{name: "engine gone", reason: "connection refused", spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			p.Close()
			return params
		}},
		{name: "engine stuck", reason: "no answer from", kept: true, spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			old := kvPullTimeout
			kvPullTimeout = 100 * time.Millisecond
			t.Cleanup(func() { kvPullTimeout = old })
			host, port, _ := net.SplitHostPort(testenv.SilentListener(t).Addr)
			n, _ := strconv.Atoi(port)
			return setParam(t, setParam(t, params, "remote_host", host), "remote_port", n)
		}},
		{name: "taken already", reason: "taken already", spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			d := newEngine(t, kvConfig())
			if _, err := decodeRun(d, schemas.KindChat, pdChat, params, nil); err != nil {
				t.Fatal(err)
			}
			return params
		}},
		{name: "unknown request", reason: "never held", kept: true, spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			return setParam(t, params, "remote_request_id", "chatcmpl-nope")
		}},
		{name: "other blocks", reason: "are not those held", kept: true, spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			return setParam(t, params, "remote_block_ids", []int{7, 8})
		}},
		{name: "other prompt", reason: "not the one prefilled", kept: true,
			body: strings.Replace(pdChat, "lighthouse", "windmill", 1)},
		{name: "dropped by a sleep", reason: "dropped", spoil: func(t *testing.T, p *Engine, params []byte) []byte {
			if err := p.Sleep(context.Background()); err != nil {
				t.Fatal(err)
			}
			return params
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := kvConfig()
			if tc.hold > 0 {
				pc.KVHoldTime = tc.hold
			}
			p, d := newEngine(t, pc), newEngine(t, kvConfig())
			_, params := prefillRun(t, p, schemas.KindChat, pdChat)
			if tc.spoil != nil {
				params = tc.spoil(t, p, params)
			}
			body := pdChat
			if tc.body != "" {
				body = tc.body
			}
			body = strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
			sink := &recSink{}
			_, err := decodeRun(d, schemas.KindChat, body, params, sink)
			se := asError(t, err)
			if !schemas.ErrKVTransferFailed.Is(se) || se.Status != 503 || !strings.Contains(se.Body.Message, tc.reason) {
				t.Fatalf("error %v, want kv_transfer_failed: ...%s...", se, tc.reason)
			}
			if len(sink.lines()) != 0 {
				t.Fatalf("chunks before the error: %q", sink.lines())
			}
			if st := d.KVTransferStats(); st.Failed != 1 || st.RemotePrefills != 0 {
				t.Fatalf("decode stats %+v", st)
			}
			if st := d.Stats(); st.Waiting != 0 || st.Running != 0 || st.KVCacheUsage != 0 {
				t.Fatalf("decode stats after the failure %+v", st)
			}
			if held := p.KVTransferStats().HeldRequests; held != map[bool]int{true: 1}[tc.kept] {
				t.Fatalf("prefill holds %d, kept %v", held, tc.kept)
			}
		})
	}
}

// TestTransferParamsRead: the members the sim reads, their types, and
// what it tolerates.
func TestTransferParamsRead(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		param        string // a 400 naming it; "": accepted
		pull         bool
		blocks       []int64
	}{
		{name: "unknown members", params: `{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1,2],"remote_host":"h","remote_port":5,"tp_size":1,"x":{"y":[1]}}`,
			pull: true, blocks: []int64{1, 2}},
		{name: "groups of blocks", params: `{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[[1,2],[3]],"remote_host":"h","remote_port":"5"}`,
			pull: true, blocks: []int64{1, 2, 3}},
		{name: "the prefill's own", params: schemas.PrefillTransferParams},
		{name: "no host", params: `{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1],"remote_port":5}`},
		{name: "no blocks", params: `{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[],"remote_host":"h","remote_port":5}`},
		{name: "bool type", params: `{"do_remote_decode":"yes"}`, param: "kv_transfer_params.do_remote_decode"},
		{name: "port type", params: `{"remote_port":"http"}`, param: "kv_transfer_params.remote_port"},
		{name: "blocks type", params: `{"remote_block_ids":"1,2"}`, param: "kv_transfer_params.remote_block_ids"},
		{name: "engine id type", params: `{"remote_engine_id":{}}`, param: "kv_transfer_params.remote_engine_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseTransferParams([]byte(tc.params))
			if tc.param != "" {
				if err == nil || err.Status != 400 || err.Body.Param == nil || *err.Body.Param != tc.param {
					t.Fatalf("error %v, want a 400 about %s", err, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.pullable() != tc.pull || (tc.pull && !slices.Equal(p.blocks, tc.blocks)) {
				t.Fatalf("params %+v", p)
			}
		})
	}
	// Params a pull cannot use are ignored, as vLLM does: a local prefill.
	e := newEngine(t, kvConfig())
	body := strings.Replace(pdChat, `"max_tokens"`, `"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1]},"max_tokens"`, 1)
	if a := chatAnswer(t, e, body); a.finish != "length" {
		t.Fatalf("answer %+v", a)
	}
	if st := e.KVTransferStats(); st.RemotePrefills != 0 || st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHeldBlocksNotEvictable: blocks held for a decode cannot go to another
// request until a decode takes them.
func TestHeldBlocksNotEvictable(t *testing.T) {
	cfg := kvConfig()
	cfg.NumBlocks, cfg.MaxModelLen = 64, 1000 // 1024 tokens
	p := newEngine(t, cfg)
	long := func(word string, n int) string {
		return `{"messages":[{"role":"user","content":"` + strings.Repeat(word, n) + `"}],"max_tokens":8,"ignore_eos":true}`
	}
	_, params := prefillRun(t, p, schemas.KindChat, long(" hello", 500))
	held := p.KVTransferStats().HeldBlocks
	if held < 30 {
		t.Fatalf("%d blocks held", held)
	}
	// 600 tokens need more blocks than are left: the request waits, and
	// the scheduler sleeps meanwhile (a few turns, not a spin).
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	turns := p.noSteps.Load()
	if _, err := p.Generate(ctx, &engine.Request{Kind: schemas.KindChat, Body: []byte(long(" world", 600))}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request that cannot fit: %v", err)
	}
	if n := p.noSteps.Load() - turns; n > 10 {
		t.Fatalf("the scheduler took %d turns while nothing could run", n)
	}
	// Taken by a decode engine, they are free: it runs.
	d := newEngine(t, kvConfig())
	if _, err := decodeRun(d, schemas.KindChat, long(" hello", 500), params, nil); err != nil {
		t.Fatal(err)
	}
	mustGen(t, p, schemas.KindChat, long(" world", 600), nil)
}

// TestTransferTime: a decode with a transferred 4000-token prompt takes
// the transfer time and one decode step to its first token, not the
// prefill's, and its admission makes no prefill step.
func TestTransferTime(t *testing.T) {
	p := newEngine(t, kvConfig())
	cfg := kvConfig()
	cfg.PrefillBase, cfg.PrefillPerToken = 500*time.Millisecond, time.Millisecond // a prefill of 4000 tokens: 4.5s
	cfg.DecodeBase = 2 * time.Millisecond
	cfg.KVTransferBase, cfg.KVTransferPerToken = 20*time.Millisecond, 5*time.Microsecond // 20ms + 20ms
	d := newEngine(t, cfg)
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat(" hello", 4000) + `"}],"max_tokens":5,"ignore_eos":true,"stream":true}`
	_, params := prefillRun(t, p, schemas.KindChat, body)
	sink := &recSink{}
	start := time.Now()
	res, err := decodeRun(d, schemas.KindChat, body, params, sink)
	if err != nil {
		t.Fatal(err)
	}
	prompt := res.Usage.PromptTokens
	if prompt < 4000 {
		t.Fatalf("prompt of %d tokens", prompt)
	}
	transfer := cfg.KVTransferBase + time.Duration(prompt)*cfg.KVTransferPerToken
	ttft := sink.times[0].Sub(start)
	if ttft < transfer || ttft > transfer+400*time.Millisecond {
		t.Fatalf("time to first token %v, want the transfer's %v and a decode step (a prefill: %v)", ttft, transfer,
			cfg.PrefillBase+time.Duration(prompt)*cfg.PrefillPerToken)
	}
	if m := d.Metrics(); m.Steps != 5 {
		t.Fatalf("%d steps", m.Steps)
	}
}

// TestTransferDoesNotStall: the transfer happens beside the running batch,
// and the transferred request joins it in a decode step.
func TestTransferDoesNotStall(t *testing.T) {
	p := newEngine(t, kvConfig())
	cfg := kvConfig()
	cfg.PrefillBase, cfg.DecodeBase = 500*time.Millisecond, 5*time.Millisecond
	cfg.KVTransferBase = 400 * time.Millisecond
	d := newEngine(t, cfg)
	// A stream decoding on d (its own prefill first: 500ms), for 1s.
	started := make(chan struct{})
	sink := &recSink{onCall: func(n int) error {
		if n == 3 {
			close(started)
		}
		return nil
	}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := gen(t, d, schemas.KindChat, `{"messages":[{"role":"user","content":"Go on"}],"max_tokens":200,"ignore_eos":true,"stream":true}`, sink)
		if err != nil {
			t.Error(err)
		}
	}()
	<-started
	_, params := prefillRun(t, p, schemas.KindChat, pdChat)
	done := make(chan error, 1)
	go func() {
		_, err := decodeRun(d, schemas.KindChat, pdChat, params, nil)
		done <- err
	}()
	wantStats(t, d, func(st engine.Stats) bool { return st.Waiting == 1 && st.Running == 1 }) // waiting for its KV
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for i := 4; i < len(sink.times); i++ {
		if gap := sink.times[i].Sub(sink.times[i-1]); gap > 250*time.Millisecond {
			t.Fatalf("the running stream stalled %v at chunk %d (transfer %v, prefill step %v)", gap, i, cfg.KVTransferBase, cfg.PrefillBase)
		}
	}
}

// TestTransferCancelled: a client that goes away cancels either phase:
// a prefill holds nothing, a decode waiting for its blocks leaves at once.
func TestTransferCancelled(t *testing.T) {
	t.Run("prefill", func(t *testing.T) {
		cfg := kvConfig()
		cfg.PrefillBase = 300 * time.Millisecond // a step is not cut short: the abort takes effect at its end
		p := newEngine(t, cfg)
		pb, _ := schemas.PrefillBody([]byte(pdChat))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := p.Generate(ctx, &engine.Request{Kind: schemas.KindChat, Body: pb}, nil)
			done <- err
		}()
		wantStats(t, p, func(st engine.Stats) bool { return st.Running == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v", err)
		}
		wantStats(t, p, func(st engine.Stats) bool { return st.Running == 0 && st.KVCacheUsage == 0 })
		if st := p.KVTransferStats(); st.Prefills != 0 || st.HeldRequests != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("decode", func(t *testing.T) {
		p := newEngine(t, kvConfig())
		cfg := kvConfig()
		cfg.KVTransferBase = time.Minute
		d := newEngine(t, cfg)
		_, params := prefillRun(t, p, schemas.KindChat, pdChat)
		db, _ := schemas.DecodeBody([]byte(pdChat), params)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := d.Generate(ctx, &engine.Request{Kind: schemas.KindChat, Body: db}, nil)
			done <- err
		}()
		wantStats(t, d, func(st engine.Stats) bool { return st.Waiting == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v", err)
		}
		if st := d.Stats(); st.Waiting != 0 || st.Running != 0 {
			t.Fatalf("stats %+v", st)
		}
		if st := d.KVTransferStats(); st.Failed != 0 || st.RemotePrefills != 0 {
			t.Fatalf("transfer stats %+v", st)
		}
	})
}

// The params come in a request body: a decode pulls only from loopback,
// this host's name or a configured peer, and refuses any other host at
// once, connecting nowhere.
func TestTransferPeersOnly(t *testing.T) {
	p := newEngine(t, kvConfig())
	body := `{"messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"ignore_eos":true}`
	_, params := prefillRun(t, p, schemas.KindChat, body)
	elsewhere := setParam(t, params, "remote_host", "198.51.100.7") // TEST-NET-2: nobody
	d := newEngine(t, kvConfig())
	start := time.Now()
	_, err := decodeRun(d, schemas.KindChat, body, elsewhere, nil)
	if !schemas.ErrKVTransferFailed.Is(schemas.AsError(err)) || !strings.Contains(err.Error(), "not a KV-transfer peer") ||
		time.Since(start) > time.Second {
		t.Fatalf("a pull from an unlisted host: %v after %v", err, time.Since(start))
	}
	cfg := kvConfig()
	cfg.KVPeers = []string{"198.51.100.7"}
	listed := newEngine(t, cfg)
	if !listed.kvPeer("198.51.100.7") || listed.kvPeer("198.51.100.8") || !listed.kvPeer("127.0.0.1") || !listed.kvPeer("::1") {
		t.Fatal("kvPeer")
	}
	// Loopback, as the prefill said it: taken.
	if _, err := decodeRun(d, schemas.KindChat, body, params, nil); err != nil {
		t.Fatal(err)
	}
}
