package workers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// disaggPair is a prefill worker "p" and a decode worker "d" on sim
// engines, on a real NATS server.
type disaggPair struct {
	nc         *nats.Conn
	p, d       *Worker
	pEng, dEng *sim.Engine
}

func startDisaggPair(t testing.TB, prefill func(*sim.Config), pcfg Config) *disaggPair {
	return startDisaggPairWith(t, prefill, nil, pcfg)
}

// startDisaggPairWith is startDisaggPair with the decode engine's config too.
func startDisaggPairWith(t testing.TB, prefill, decode func(*sim.Config), pcfg Config) *disaggPair {
	t.Helper()
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	newSim := func(f func(*sim.Config)) *sim.Engine {
		c := sim.DefaultConfig()
		c.Model = "m"
		if f != nil {
			f(&c)
		}
		e, err := sim.New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	pp := &disaggPair{nc: nc, pEng: newSim(prefill), dEng: newSim(decode)}
	start := func(id, role string, eng *sim.Engine, cfg Config) *Worker {
		cfg.ID, cfg.Role = id, role
		w, err := New(cfg, testenv.Connect(t, ns), eng, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		<-w.Ready()
		t.Cleanup(func() { cancel(); <-done })
		return w
	}
	pp.p, pp.d = start("p", schemas.RolePrefill, pp.pEng, pcfg), start("d", schemas.RoleDecode, pp.dEng, Config{})
	return pp
}

func longChat(words int, stream bool) string {
	return fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"%s"}]}`,
		stream, strings.Repeat("word ", words))
}

// A client that goes away while its request's prefill runs on the prefill
// worker (here: waits for the engine to wake up) stops it there.
func TestRemotePrefillCancelled(t *testing.T) {
	pp := startDisaggPair(t, func(c *sim.Config) { c.WakeTime = time.Minute }, Config{SleepAfter: 10 * time.Millisecond})
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !pp.pEng.Sleeping() {
			return fmt.Errorf("the prefill engine is awake")
		}
		return nil
	})
	f, inbox := collect(t, pp.nc)
	token := schemas.NewCancelToken()
	h := nats.Header{schemas.HdrRequestID: {"r1"}, schemas.HdrKind: {"chat"}, schemas.HdrModel: {"m"},
		schemas.HdrCancelToken: {token}, schemas.HdrPrefillWorker: {"p"}}
	if err := pp.nc.PublishMsg(&nats.Msg{Subject: schemas.WorkSubject("d"), Reply: inbox, Header: h, Data: []byte(longChat(500, true))}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if pp.p.Running() != 1 || pp.d.Running() != 1 {
			return fmt.Errorf("p runs %d, d runs %d", pp.p.Running(), pp.d.Running())
		}
		return nil
	})
	if err := pp.nc.Publish(schemas.CancelSubject("d"), schemas.CancelBody("r1", token)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Second, func() error {
		if pp.p.Running() != 0 || pp.d.Running() != 0 {
			return fmt.Errorf("p runs %d, d runs %d; frames %v", pp.p.Running(), pp.d.Running(), f.types())
		}
		return nil
	})
}

// BenchmarkDisaggTTFT is what disaggregation adds to a request's time to
// first token on the bus path: the decode worker's prefill request to the
// prefill worker and its answer over NATS, the bodies rewritten, and the
// sims' own work at zero simulated cost (each tokenizes the prompt; the
// decode pulls the "KV blocks" from the prefill engine over loopback HTTP,
// its stand-in for NIXL). whole is the same request run on the decode
// worker alone. ttft-p50-µs is the median from publishing the request to
// its first chunk frame; ns/op is a whole request.
func BenchmarkDisaggTTFT(b *testing.B) {
	zero := func(c *sim.Config) {
		c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq = 0, 0, 0, 0
		c.KVTransferBase, c.KVTransferPerToken = 0, 0
	}
	for _, words := range []int{64, 4000} {
		for _, mode := range []string{"whole", "disaggregated"} {
			b.Run(fmt.Sprintf("prompt=%d/%s", words, mode), func(b *testing.B) {
				pp := startDisaggPairWith(b, zero, zero, Config{})
				ttftBench(b, pp.nc, []byte(longChat(words, true)), mode == "disaggregated")
				if mode == "disaggregated" {
					if st := pp.dEng.KVTransferStats(); st.RemotePrefills == 0 {
						b.Fatalf("no remote prefill: %+v", st)
					}
				}
			})
		}
	}
}

// handshakeEngine answers at once: a prefill (do_remote_decode) with fixed
// kv_transfer_params, anything else with one chunk. It has no tokenizer
// and no KV cache: with it, BenchmarkDisaggBusPath measures the bus path
// alone.
type handshakeEngine struct{ gateEngine }

func (e *handshakeEngine) KVTransfer() bool { return true }

func (e *handshakeEngine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	if req.View != nil && req.View.KVTransfer != nil && !req.View.Stream {
		return &engine.Result{Response: []byte(`{"id":"x","object":"chat.completion","choices":[],` +
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],` +
			`"remote_engine_id":"e","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`)}, nil
	}
	if err := sink.Chunks([]byte(`{"n":1}`)); err != nil {
		return nil, err
	}
	return &engine.Result{Usage: schemas.Usage{CompletionTokens: 1}}, nil
}

// BenchmarkDisaggBusPath is the handshake's own cost on the way to the
// first token: the decode worker's prefill request to the prefill worker
// over NATS, its frames back, the bodies rewritten and read again, with
// engines that answer at once (handshakeEngine). whole: the same request on the
// decode worker alone. ttft-p50-µs: publishing the request to its first
// chunk frame.
func BenchmarkDisaggBusPath(b *testing.B) {
	for _, words := range []int{64, 4000} {
		for _, mode := range []string{"whole", "disaggregated"} {
			b.Run(fmt.Sprintf("prompt=%d/%s", words, mode), func(b *testing.B) {
				ns := testenv.NATS(b)
				nc := testenv.Connect(b, ns)
				for _, w := range []struct{ id, role string }{{"p", schemas.RolePrefill}, {"d", schemas.RoleDecode}} {
					wk, err := New(Config{ID: w.id, Role: w.role}, testenv.Connect(b, ns), &handshakeEngine{}, nil)
					if err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan error, 1)
					go func() { done <- wk.Run(ctx) }()
					<-wk.Ready()
					b.Cleanup(func() { cancel(); <-done })
				}
				ttftBench(b, nc, []byte(longChat(words, true)), mode == "disaggregated")
			})
		}
	}
}

// ttftBench sends requests to worker d one at a time and reports the
// median time to the first chunk frame.
func ttftBench(b *testing.B, nc *nats.Conn, body []byte, disagg bool) {
	var ttfts []time.Duration
	i := 0
	for b.Loop() {
		i++
		inbox := nats.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			b.Fatal(err)
		}
		h := nats.Header{schemas.HdrRequestID: {fmt.Sprintf("r%d", i)}, schemas.HdrKind: {"chat"}, schemas.HdrModel: {"m"},
			schemas.HdrCancelToken: {schemas.NewCancelToken()}}
		if disagg {
			h.Set(schemas.HdrPrefillWorker, "p")
		}
		start := time.Now()
		if err := nc.PublishMsg(&nats.Msg{Subject: schemas.WorkSubject("d"), Reply: inbox, Header: h, Data: body}); err != nil {
			b.Fatal(err)
		}
		first := true
		for {
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				b.Fatal(err)
			}
			f, _ := schemas.ParseFrame(m.Data)
			if f.Type == schemas.FrameChunk && first {
				first = false
				ttfts = append(ttfts, time.Since(start))
			}
			if f.Type == schemas.FrameError {
				b.Fatalf("error frame %s", f.Payload)
			}
			if f.Type.Terminal() {
				break
			}
		}
		_ = sub.Unsubscribe()
	}
	b.StopTimer()
	slices.Sort(ttfts)
	b.ReportMetric(float64(ttfts[len(ttfts)/2].Microseconds()), "ttft-p50-µs")
}

// What a call takes from its headers and body: a prefill keeps its
// kv_transfer_params, any other request loses a client's; a prefill worker
// named by something that is no subject token is none.
func TestReadDisagg(t *testing.T) {
	params := `{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9"}}`
	for _, tc := range []struct {
		name, worker string
		prefill      bool
		wantWorker   string
		keepsParams  bool
	}{
		{"a client's params are removed", "", false, "", false},
		{"a prefill keeps them", "", true, "", true},
		{"a prefill is not disaggregated again", "p", true, "", true},
		{"a prefill worker", "p", false, "p", false},
		{"a wildcard is no worker", "p.*", false, "", false},
		{"a subject tail is no worker", ">", false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			view, err := schemas.ReadRequestFor(schemas.KindChat, []byte(params), "m")
			if err != nil {
				t.Fatal(err)
			}
			c := &call{req: engine.Request{Kind: schemas.KindChat, Model: "m", Body: []byte(params), View: view}}
			h := nats.Header{}
			if tc.worker != "" {
				h.Set(schemas.HdrPrefillWorker, tc.worker)
			}
			if err := c.readDisagg(h, tc.prefill); err != nil {
				t.Fatal(err)
			}
			if c.prefillWorker != tc.wantWorker || (c.req.View.KVTransfer != nil) != tc.keepsParams ||
				strings.Contains(string(c.req.Body), "kv_transfer_params") != tc.keepsParams {
				t.Fatalf("worker %q, params %s, body %s", c.prefillWorker, c.req.View.KVTransfer, c.req.Body)
			}
		})
	}
}
