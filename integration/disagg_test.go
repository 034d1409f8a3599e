package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
)

// Prefill/decode disaggregation (docs/disaggregation.md) end to end: in
// one process (dev with prefill and decode sim workers), then the faults,
// each through real processes: a prefill worker killed, a decode worker
// killed mid-stream, a decode engine refusing the transferred KV cache, a
// client hanging up during the prefill.

// longPrompt is about 750 tokens by the dispatcher's estimate (bytes / 4).
var longPrompt = strings.Repeat("the quick brown fox jumps over ", 100)

// metricSum sums the samples of metric whose labels contain every one of
// labels (`outcome="ok"`...), on the /metrics page at url; 0 when none.
func metricSum(t *testing.T, url, metric string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(name, l) {
				continue next
			}
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += f
	}
	return sum
}

// streamText streams a chat completion of exactly n tokens (ignore_eos) and
// returns its text.
func streamText(ctx context.Context, c openai.Client, prompt string, n int) (string, error) {
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(int64(n)),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}, option.WithJSONSet("ignore_eos", true))
	var b strings.Builder
	chunks := 0
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			b.WriteString(ch.Choices[0].Delta.Content)
			chunks++
		}
	}
	if err := st.Err(); err != nil {
		return b.String(), err
	}
	if chunks != n {
		return b.String(), fmt.Errorf("%d content chunks, want %d", chunks, n)
	}
	return b.String(), nil
}

// TestDisaggregatedRequests: dev with one prefill and two decode workers.
// A long prompt is prefilled on the prefill worker and decoded on a decode
// worker, streaming or not, chat or completions, with the very text a whole
// run gives (the sim's output follows the prompt); a short one runs whole;
// the trace shows both workers. Not parallel: tracing is the process's.
func TestDisaggregatedRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two devs")
	}
	rcv := testenv.StartOTLPReceiver(t)
	d := startDevIn(t, process{otlp: rcv.URL}, func(c *program.DevConfig) {
		c.SimWorkers, c.PrefillWorkers = 2, 1
		c.Dispatcher.Disagg.MinPromptTokens = 200
	})
	ref := startDev(t, func(c *program.DevConfig) { c.SimWorkers = 1 }) // whole runs, for the text
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, rc := openaiClient(d.URL+"/v1"), openaiClient(ref.URL+"/v1")

	// Streams, chat.
	for i := range 3 {
		prompt := fmt.Sprintf("%d %s", i, longPrompt)
		got, err := streamText(ctx, c, prompt, 24)
		if err != nil {
			t.Fatalf("disaggregated stream %d: %v", i, err)
		}
		want, err := streamText(ctx, rc, prompt, 24)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("stream %d: disaggregated %q, whole %q", i, got, want)
		}
	}
	// Not streamed, and completions.
	chat := func(cl openai.Client) string {
		r, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(16),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("non-stream " + longPrompt)}},
			option.WithJSONSet("ignore_eos", true))
		if err != nil {
			t.Fatal(err)
		}
		if r.Usage.CompletionTokens != 16 || r.Usage.PromptTokens < 500 {
			t.Fatalf("usage %+v", r.Usage)
		}
		return r.Choices[0].Message.Content
	}
	if got, want := chat(c), chat(rc); got != want {
		t.Fatalf("non-stream: disaggregated %q, whole %q", got, want)
	}
	completion := func(cl openai.Client) string {
		r, err := cl.Completions.New(ctx, openai.CompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(8),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("completion " + longPrompt)}},
			option.WithJSONSet("ignore_eos", true))
		if err != nil {
			t.Fatal(err)
		}
		return r.Choices[0].Text
	}
	if got, want := completion(c), completion(rc); got != want {
		t.Fatalf("completion: disaggregated %q, whole %q", got, want)
	}
	// A short prompt runs whole.
	if _, err := streamText(ctx, c, "a short chat", 4); err != nil {
		t.Fatal(err)
	}
	metrics := d.URL + "/metrics"
	for _, m := range []struct {
		metric string
		labels []string
		want   float64
	}{
		{"tokenbus_dispatcher_disagg_total", []string{`decision="disaggregated"`}, 5},
		{"tokenbus_dispatcher_disagg_total", []string{`decision="short_prompt"`}, 1},
		{"tokenbus_worker_remote_prefills_total", []string{`outcome="ok"`}, 5},
		{"tokenbus_worker_prefills_served_total", []string{`outcome="ok"`, `worker="dev-prefill-1"`}, 5},
		{"tokenbus_worker_requests_total", []string{`outcome="ok"`, `worker="dev-prefill-1"`}, 5},
	} {
		if got := metricSum(t, metrics, m.metric, m.labels...); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.metric, m.labels, got, m.want)
		}
	}
	if n := metricSum(t, metrics, "tokenbus_worker_kv_transfer_seconds_count"); n != 3 { // the streams
		t.Errorf("kv transfer observations %v, want 3", n)
	}

	// One trace holds both workers: the decode worker's generate span, its
	// prefill span, and under that the prefill worker's generate span.
	tp, traceID, _ := newTraceparent()
	s := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","max_tokens":4,"messages":[{"role":"user","content":"traced `+longPrompt+`"}]}`,
		"traceparent", tp)
	if s.Status != 200 {
		t.Fatalf("traced request: %d %s", s.Status, s.Body)
	}
	d.stop()
	spans := rcv.Trace(traceID)
	var dispatch, decode, prefill, prefillRun *testenv.Span
	for i := range spans {
		sp := &spans[i]
		switch {
		case strings.HasPrefix(sp.Name, "dispatch "):
			dispatch = sp
		case sp.Name == "prefill llama-8b":
			prefill = sp
		case sp.Name == "generate llama-8b" && sp.Attrs["tokenbus.worker.id"] == "dev-prefill-1":
			prefillRun = sp
		case sp.Name == "generate llama-8b":
			decode = sp
		}
	}
	if dispatch == nil || decode == nil || prefill == nil || prefillRun == nil {
		t.Fatalf("spans of a disaggregated request: dispatch %v decode %v prefill %v prefill run %v; have %+v",
			dispatch != nil, decode != nil, prefill != nil, prefillRun != nil, spans)
	}
	if dispatch.Attrs["tokenbus.prefill.worker.id"] != "dev-prefill-1" || prefill.ParentSpanID != decode.SpanID ||
		prefillRun.ParentSpanID != prefill.SpanID || prefill.Attrs["tokenbus.prefill.outcome"] != "ok" ||
		prefill.Attrs["tokenbus.prefill.remote_engine_id"] == "" {
		t.Fatalf("span tree: dispatch %+v decode %+v prefill %+v prefill run %+v", *dispatch, *decode, *prefill, *prefillRun)
	}
}

// disaggProcs is a disaggregated deployment as separate processes: NATS,
// Redis, a gateway that disaggregates prompts of 16 tokens or more, and
// the workers a test starts.
type disaggProcs struct {
	bin, base string
	common    []string
	hb        *heartbeats
}

func startDisaggProcs(t *testing.T) *disaggProcs {
	t.Helper()
	p := &disaggProcs{bin: tokenbusBinary(t)}
	rd := testenv.StartRedis(t)
	natsURL, httpPort := procNATS(t), testenv.FreePort(t)
	p.common = []string{"--nats-url", natsURL, "--redis-url", rd.URL}
	p.hb = watchHeartbeats(t, natsURL)
	startProc(t, "gateway", p.bin, append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--auth=false",
		"--admin", "", "--disagg-min-prompt-tokens", "16"}, p.common...)...)
	p.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitPath(t, p.base, "/health")
	return p
}

// worker starts a worker process of role with args; it returns the process
// and its /metrics URL.
func (p *disaggProcs) worker(t *testing.T, id, role string, args ...string) (*proc, string) {
	t.Helper()
	mp := testenv.FreePort(t)
	a := append([]string{"worker", "--id", id, "--role", role, "--metrics", fmt.Sprintf("127.0.0.1:%d", mp)}, args...)
	w := startProc(t, id, p.bin, append(a, p.common...)...)
	testenv.WaitFor(t, 15*time.Second, func() error {
		p.hb.mu.Lock()
		defer p.hb.mu.Unlock()
		if hb, ok := p.hb.last[id]; !ok || !hb.Healthy {
			return fmt.Errorf("%s not up", id)
		}
		return nil
	})
	return w, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)
}

func (p *disaggProcs) running(id string) int {
	p.hb.mu.Lock()
	defer p.hb.mu.Unlock()
	return p.hb.last[id].Running
}

func (p *disaggProcs) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(p.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// streams runs n streams of k tokens each at once and returns their errors.
func streams(ctx context.Context, c openai.Client, n, k int, prompt string) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = streamText(ctx, c, fmt.Sprintf("%d %s", i, prompt), k) })
	}
	wg.Wait()
	return errs
}

// TestPrefillWorkerKilled: the prefill worker dies (kill -9) with every
// request's prefill under way; the decode worker hears nothing from it for
// a second and runs each request whole. None fails.
func TestPrefillWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and a kill -9")
	}
	t.Parallel()
	p := startDisaggProcs(t)
	pw, _ := p.worker(t, "p1", "prefill", "--sim-prefill-base", "20s")
	_, dm := p.worker(t, "d1", "decode", "--sim-decode-base", "5ms")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 6
	var errs []error
	done := make(chan struct{})
	go func() { errs = streams(ctx, p.client(), n, 8, longPrompt); close(done) }()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if r := p.running("p1"); r != n {
			return fmt.Errorf("p1 runs %d prefills of %d", r, n)
		}
		return nil
	})
	pw.kill9(t)
	killed := time.Now()
	<-done
	t.Logf("killed the prefill worker during %d prefills; all done %v later", n, time.Since(killed).Round(10*time.Millisecond))
	for i, err := range errs {
		if err != nil {
			t.Errorf("stream %d: %v", i, err)
		}
	}
	if got := metricSum(t, dm, "tokenbus_worker_remote_prefills_total", `outcome="lost"`); got != n {
		t.Errorf("remote prefills lost: %v, want %d", got, n)
	}
}

// TestDecodeWorkerKilledDisaggregated: a decode worker dies mid-stream;
// its streams move to the other decode worker, which continues them (the
// client's migration, as for any worker; a continuation runs whole). Every
// stream has all its tokens.
func TestDecodeWorkerKilledDisaggregated(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and a kill -9")
	}
	t.Parallel()
	p := startDisaggProcs(t)
	_, pm := p.worker(t, "p1", "prefill")
	w1, _ := p.worker(t, "d1", "decode", "--sim-decode-base", "40ms")
	p.worker(t, "d2", "decode", "--sim-decode-base", "40ms")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, k = 8, 40
	var errs []error
	done := make(chan struct{})
	go func() { errs = streams(ctx, p.client(), n, k, longPrompt); close(done) }()
	// Every stream was disaggregated (the prefill worker ran all n
	// prefills) and d1 streams some of them: the kill finds it mid-stream.
	testenv.WaitFor(t, 10*time.Second, func() error {
		served := metricSum(t, pm, "tokenbus_worker_prefills_served_total", `outcome="ok"`)
		if r := p.running("d1"); served < n || r == 0 {
			return fmt.Errorf("prefills served %v of %d, d1 runs %d", served, n, r)
		}
		return nil
	})
	w1.kill9(t)
	<-done
	for i, err := range errs {
		if err != nil {
			t.Errorf("stream %d: %v", i, err)
		}
	}
}

// TestDecodeRefusesTransfer: the prefill engine keeps its KV blocks for
// less time than the decode takes to ask for them, so the decode engine
// refuses the params; the decode worker runs each request whole, before
// anything was streamed. None fails.
func TestDecodeRefusesTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes")
	}
	t.Parallel()
	p := startDisaggProcs(t)
	p.worker(t, "p1", "prefill", "--sim-kv-hold", "1ns")
	_, dm := p.worker(t, "d1", "decode")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 4
	for i, err := range streams(ctx, p.client(), n, 8, longPrompt) {
		if err != nil {
			t.Errorf("stream %d: %v", i, err)
		}
	}
	// A pull that beats the hold's expiry is taken: each request is one or
	// the other, and most are refused.
	refused := metricSum(t, dm, "tokenbus_worker_remote_prefills_total", `outcome="refused"`)
	ok := metricSum(t, dm, "tokenbus_worker_remote_prefills_total", `outcome="ok"`)
	if refused+ok != n || refused == 0 {
		t.Errorf("transfers refused %v, taken %v, of %d", refused, ok, n)
	}
}

// TestClientHangUpDuringPrefill: a client that goes away while its request
// is in its prefill phase stops it on the prefill worker.
func TestClientHangUpDuringPrefill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes")
	}
	t.Parallel()
	p := startDisaggProcs(t)
	// The prefill phase is the prefill engine's wake-up: a step of the sim,
	// as of vLLM, is not cut short by an abort; a wake-up is.
	_, pm := p.worker(t, "p1", "prefill", "--sleep-after", "100ms", "--sim-wake-time", "1m")
	_, dm := p.worker(t, "d1", "decode")
	testenv.WaitFor(t, 10*time.Second, func() error {
		p.hb.mu.Lock()
		defer p.hb.mu.Unlock()
		if !p.hb.last["p1"].Sleeping {
			return fmt.Errorf("p1 awake")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := streamText(ctx, p.client(), longPrompt, 8); errc <- err }()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if r := p.running("p1"); r != 1 {
			return fmt.Errorf("p1 runs %d prefills", r)
		}
		return nil
	})
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled stream succeeded")
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if r := p.running("p1") + p.running("d1"); r != 0 {
			return fmt.Errorf("still running: p1 %d d1 %d", p.running("p1"), p.running("d1"))
		}
		if c := metricSum(t, pm, "tokenbus_worker_prefills_served_total", `outcome="cancelled"`); c != 1 {
			return fmt.Errorf("prefills cancelled on p1: %v", c)
		}
		return nil
	})
	if got := metricSum(t, dm, "tokenbus_worker_remote_prefills_total", `outcome="cancelled"`); got != 1 {
		t.Errorf("remote prefills cancelled on d1: %v", got)
	}
}
