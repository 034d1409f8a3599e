package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

func TestPercentile(t *testing.T) {
	// expected values are numpy.percentile's (linear interpolation)
	xs := []float64{1, 2, 3, 4}
	tests := []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{xs, 0, 1},
		{xs, 50, 2.5},
		{xs, 90, 3.7},
		{xs, 99, 3.97},
		{xs, 100, 4},
		{[]float64{7}, 50, 7},
		{[]float64{7}, 99, 7},
		{[]float64{0, 10}, 25, 2.5},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9.1},
	}
	for _, tt := range tests {
		if got := percentile(tt.xs, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("percentile(%v, %v) = %v, want %v", tt.xs, tt.p, got, tt.want)
		}
	}
	if !math.IsNaN(percentile(nil, 50)) {
		t.Error("percentile of empty sample should be NaN")
	}
}

func TestSummarize(t *testing.T) {
	d := summarize([]float64{4, 1, 3, 2})
	want := Dist{N: 4, Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97, Max: 4}
	if math.Abs(d.P90-want.P90) > 1e-9 || math.Abs(d.P99-want.P99) > 1e-9 || d.N != 4 || d.Mean != 2.5 || d.P50 != 2.5 || d.Max != 4 {
		t.Errorf("summarize = %+v, want %+v", d, want)
	}
	if d := summarize(nil); d != (Dist{}) {
		t.Errorf("summarize(nil) = %+v, want zero", d)
	}
}

func TestArrivals(t *testing.T) {
	for _, rate := range []float64{5, 100, 2000} {
		const n = 20000
		a := arrivals(n, rate, rand.New(rand.NewPCG(1, 2)))
		if a[0] != 0 {
			t.Errorf("rate %v: first arrival %v, want 0", rate, a[0])
		}
		gaps := make([]float64, n-1)
		for i := 1; i < n; i++ {
			gaps[i-1] = (a[i] - a[i-1]).Seconds()
			if gaps[i-1] < 0 {
				t.Fatalf("arrivals not monotonic at %d", i)
			}
		}
		mean := 0.0
		for _, g := range gaps {
			mean += g
		}
		mean /= float64(len(gaps))
		got := 1 / mean
		if math.Abs(got-rate)/rate > 0.03 {
			t.Errorf("rate %v: measured %v req/s, want within 3%%", rate, got)
		}
		// exponential gaps: standard deviation equals the mean (CV = 1)
		v := 0.0
		for _, g := range gaps {
			v += (g - mean) * (g - mean)
		}
		cv := math.Sqrt(v/float64(len(gaps))) / mean
		if math.Abs(cv-1) > 0.05 {
			t.Errorf("rate %v: coefficient of variation %v, want ~1 (Poisson)", rate, cv)
		}
	}
	for _, rate := range []float64{0, math.Inf(1)} {
		for i, d := range arrivals(10, rate, rand.New(rand.NewPCG(1, 2))) {
			if d != 0 {
				t.Errorf("rate %v: arrival %d = %v, want 0 (unbounded)", rate, i, d)
			}
		}
	}
	// same seed, same schedule
	a, b := arrivals(50, 10, rand.New(rand.NewPCG(7, 1))), arrivals(50, 10, rand.New(rand.NewPCG(7, 1)))
	if !slices.Equal(a, b) {
		t.Error("arrivals with the same seed differ")
	}
}

func TestTimeline(t *testing.T) {
	recs := []record{
		// 4 tokens in 2 chunks at 0.5 s and 1.5 s: 2 tokens each
		{Start: 0, E2E: 2 * time.Second, Chunks: []uint32{500_000, 1_500_000}, Tokens: 4, FromUsage: true},
		// no usage: 1 token per chunk, starting at 1 s
		{Start: time.Second, E2E: time.Second, Chunks: []uint32{100_000, 200_000, 300_000}},
		// non-stream: tokens at the end
		{Start: 0, E2E: 1200 * time.Millisecond, Tokens: 5},
	}
	got := timeline(recs, 2*time.Second)
	want := []float64{2, 2 + 3 + 5}
	if !slices.Equal(got, want) {
		t.Errorf("timeline = %v, want %v", got, want)
	}
	// a partial last bucket is scaled to a rate
	got = timeline([]record{{Chunks: []uint32{1_200_000}}}, 1500*time.Millisecond)
	if want := []float64{0, 2}; !slices.Equal(got, want) {
		t.Errorf("timeline partial = %v, want %v", got, want)
	}
}

func TestSharedPrefixAndPrompts(t *testing.T) {
	ps := randomPrompts(3, 1, 20, 32, 100, 7, 0, "chat")
	prefix := sharedPrefix(3, 32)
	if n := len(strings.Fields(prefix)); n != 32 {
		t.Fatalf("prefix has %d words, want 32", n)
	}
	distinct := map[string]bool{}
	for _, p := range ps {
		if !strings.HasPrefix(p.prompt, prefix+" ") {
			t.Fatalf("prompt does not start with the shared prefix: %.80q", p.prompt)
		}
		if n := len(strings.Fields(p.prompt)); n != 132 || p.inputEst != 132 {
			t.Errorf("prompt has %d words (est %d), want 132", n, p.inputEst)
		}
		if p.outputLen != 7 {
			t.Errorf("outputLen %d, want 7", p.outputLen)
		}
		distinct[strings.TrimPrefix(p.prompt, prefix)] = true
	}
	if len(distinct) != len(ps) {
		t.Errorf("only %d distinct suffixes among %d prompts", len(distinct), len(ps))
	}
	again := randomPrompts(3, 1, 20, 32, 100, 7, 0, "chat")
	if again[5].prompt != ps[5].prompt {
		t.Error("same seed gave different prompts")
	}
	if other := randomPrompts(4, 1, 20, 32, 100, 7, 0, "chat"); other[0].prompt == ps[0].prompt {
		t.Error("different seeds gave the same prompt")
	}
	// no prefix: prompts of exactly input-len words
	if n := len(strings.Fields(randomPrompts(1, 1, 1, 0, 50, 1, 0, "chat")[0].prompt)); n != 50 {
		t.Errorf("got %d words, want 50", n)
	}
}

func TestBuildBody(t *testing.T) {
	tests := []struct {
		name                      string
		p                         promptSpec
		endpoint                  string
		stream, usage, ignoreEOS  bool
		wantKeys, wantMissingKeys []string
	}{
		{"chat stream", promptSpec{prompt: "hi", outputLen: 5}, "chat", true, true, true,
			[]string{"messages", "max_tokens", "ignore_eos", "stream_options"}, []string{"prompt"}},
		{"completions non-stream", promptSpec{prompt: "hi", outputLen: 5}, "completions", false, true, true,
			[]string{"prompt", "max_tokens", "ignore_eos"}, []string{"messages", "stream_options"}},
		{"no ignore_eos", promptSpec{prompt: "hi", outputLen: 5}, "chat", true, false, false,
			[]string{"messages"}, []string{"ignore_eos", "stream_options"}},
		{"dataset messages", promptSpec{messages: json.RawMessage(`[{"role":"user","content":"x"}]`)}, "chat", true, true, true,
			[]string{"messages"}, []string{"max_tokens", "ignore_eos"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(buildBody(tt.p, "m", tt.endpoint, tt.stream, tt.usage, tt.ignoreEOS), &m); err != nil {
				t.Fatal(err)
			}
			if m["model"] != "m" || m["stream"] != tt.stream {
				t.Errorf("model/stream wrong: %v", m)
			}
			for _, k := range tt.wantKeys {
				if _, ok := m[k]; !ok {
					t.Errorf("missing %q in %v", k, m)
				}
			}
			for _, k := range tt.wantMissingKeys {
				if _, ok := m[k]; ok {
					t.Errorf("unexpected %q in %v", k, m)
				}
			}
		})
	}
}

func TestParseDataset(t *testing.T) {
	good := `{"prompt": "one two three", "output_len": 4}
# comment
{"messages": [{"role": "user", "content": "hello there"}], "output_len": 9}

{"prompt": "no output len"}
`
	ps, err := parseDataset(strings.NewReader(good), "d.jsonl", "chat", "PFX", 11)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("got %d prompts, want 3", len(ps))
	}
	if ps[0].prompt != "PFX one two three" || ps[0].outputLen != 4 || ps[0].inputEst != 4 {
		t.Errorf("prompt line: %+v", ps[0])
	}
	var msgs []map[string]string
	if err := json.Unmarshal(ps[1].messages, &msgs); err != nil || len(msgs) != 2 || msgs[0]["role"] != "system" || msgs[0]["content"] != "PFX" || msgs[1]["content"] != "hello there" {
		t.Errorf("messages line: %s (%v)", ps[1].messages, err)
	}
	if ps[2].outputLen != 11 {
		t.Errorf("default output len %d, want 11", ps[2].outputLen)
	}
	bad := []struct{ name, data, endpoint string }{
		{"not json", "{nope\n", "chat"},
		{"neither", `{"foo": 1}`, "chat"},
		{"messages on completions", `{"messages": [{"role":"user","content":"x"}]}`, "completions"},
		{"empty messages", `{"messages": []}`, "chat"},
		{"empty file", "\n\n", "chat"},
	}
	for _, tt := range bad {
		if _, err := parseDataset(strings.NewReader(tt.data), "d", tt.endpoint, "", 1); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
	if got := takePrompts(ps, 7); len(got) != 7 || got[3].prompt != ps[0].prompt {
		t.Errorf("takePrompts cycles wrong: %d", len(got))
	}
	if got := takePrompts(ps, 0); len(got) != 3 {
		t.Errorf("takePrompts(0) = %d prompts, want all 3", len(got))
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"error":{"message":"boom","type":"x","param":null,"code":null}}`, "boom"},
		{`{"object":"error","message":"old vllm","code":400}`, "old vllm"},
		{`{"error":"flat"}`, "flat"},
		{"plain text\n", "plain text"},
	}
	for _, tt := range tests {
		if got := errorMessage([]byte(tt.body)); got != tt.want {
			t.Errorf("errorMessage(%s) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

// doOne sends one request of outLen tokens to the server at url (its /v1)
// and returns its record.
func doOne(t *testing.T, url, endpoint string, stream bool, outLen int, timeout time.Duration) record {
	t.Helper()
	path := "/chat/completions"
	if endpoint == "completions" {
		path = "/completions"
	}
	c := &caller{
		urls: []string{url + path}, chat: endpoint == "chat", stream: stream, usage: stream,
		timeout: timeout, client: &http.Client{Transport: newTransport(4)}, maxChunks: outLen + 1,
	}
	defer c.client.CloseIdleConnections()
	var rec record
	body := buildBody(promptSpec{prompt: "a b c", outputLen: outLen}, "m", endpoint, stream, true, true)
	c.do(context.Background(), body, &rec)
	return rec
}

// TestStreamVerification checks that every stream defect is caught, by kind.
func TestStreamVerification(t *testing.T) {
	old := afterDoneGrace
	afterDoneGrace = 100 * time.Millisecond
	t.Cleanup(func() { afterDoneGrace = old })
	tests := []struct {
		name   string
		opts   defectServer
		want   string // failure kind; "" = ok
		detail string // substring of the message
	}{
		{"ok", defectServer{}, "", ""},
		{"ok several tokens per chunk", defectServer{perTok: 3}, "", ""},
		{"missing [DONE]", defectServer{defect: "no_done"}, "protocol_missing_done", "[DONE]"},
		{"two ids", defectServer{defect: "two_ids"}, "protocol_id_changed", "-other"},
		{"missing id", defectServer{defect: "no_id"}, "protocol_missing_id", ""},
		{"error chunk", defectServer{defect: "error_chunk"}, "stream_error", "engine died"},
		{"error null", defectServer{defect: "error_null"}, "protocol_error_key", "null"},
		{"missing finish_reason", defectServer{defect: "no_finish"}, "protocol_missing_finish_reason", ""},
		{"second finish_reason", defectServer{defect: "double_finish"}, "protocol_chunk_after_finish", ""},
		{"missing usage", defectServer{defect: "no_usage"}, "protocol_missing_usage", ""},
		{"bad choice index", defectServer{defect: "bad_index"}, "protocol_choice_index", "1"},
		{"comment line", defectServer{defect: "comment_line"}, "protocol_non_data_line", ": ping"},
		{"data after [DONE]", defectServer{defect: "data_after_done"}, "protocol_data_after_done", "late"},
		{"bad json", defectServer{defect: "bad_json"}, "protocol_bad_json", ""},
		{"wrong content type", defectServer{defect: "wrong_ct"}, "protocol_content_type", "application/json"},
		{"open after [DONE]", defectServer{defect: "linger"}, "protocol_open_after_done", ""},
		{"non-200 with JSON error", defectServer{status: 503}, "http_503", "model overloaded"},
		{"non-200 400", defectServer{status: 400}, "http_400", "model overloaded"},
	}
	for _, endpoint := range []string{"chat", "completions"} {
		for _, tt := range tests {
			t.Run(endpoint+"/"+tt.name, func(t *testing.T) {
				srv := newDefectServer(t, tt.opts)
				rec := doOne(t, srv.URL(), endpoint, true, 8, 10*time.Second)
				if rec.Err != tt.want {
					t.Fatalf("kind %q (%s), want %q", rec.Err, rec.ErrMsg, tt.want)
				}
				if !strings.Contains(rec.ErrMsg, tt.detail) {
					t.Errorf("message %q does not mention %q", rec.ErrMsg, tt.detail)
				}
				if tt.want == "" {
					per := max(tt.opts.perTok, 1)
					if rec.Tokens != 8 || !rec.FromUsage || len(rec.Chunks) != (8+per-1)/per {
						t.Errorf("tokens %d (usage %v), chunks %d", rec.Tokens, rec.FromUsage, len(rec.Chunks))
					}
					if rec.E2E < rec.TTFT() || rec.TTFT() <= 0 {
						t.Errorf("ttft %v e2e %v", rec.TTFT(), rec.E2E)
					}
				}
			})
		}
	}
}

func TestNonStreamVerification(t *testing.T) {
	for _, endpoint := range []string{"chat", "completions"} {
		srv := newFakeServer(t, fakeOpts{})
		rec := doOne(t, srv.URL(), endpoint, false, 6, 10*time.Second)
		if rec.Err != "" || rec.Tokens != 6 || !rec.FromUsage || rec.TTFT() != rec.E2E {
			t.Errorf("%s: %+v", endpoint, rec)
		}
		srv = newFakeServer(t, fakeOpts{status: 429})
		if rec := doOne(t, srv.URL(), endpoint, false, 6, 10*time.Second); rec.Err != "http_429" {
			t.Errorf("%s: kind %q, want http_429", endpoint, rec.Err)
		}
	}
}

func TestTimeoutAndConnectionErrors(t *testing.T) {
	hold := make(chan struct{})
	srv := newFakeServer(t, fakeOpts{hold: hold})
	defer close(hold)
	if rec := doOne(t, srv.URL(), "chat", true, 4, 50*time.Millisecond); rec.Err != "timeout" {
		t.Errorf("kind %q (%s), want timeout", rec.Err, rec.ErrMsg)
	}
	// A target that resets the connection, held by the test (a server closed
	// a moment ago leaves its port to whoever takes it next).
	dead := testenv.ResetListener(t)
	if rec := doOne(t, "http://"+dead.Addr+"/v1", "chat", true, 4, 5*time.Second); rec.Err != "connection" {
		t.Errorf("kind %q (%s), want connection", rec.Err, rec.ErrMsg)
	}
}

// runBench runs Run and returns stdout, the error, and the parsed --json.
func runBench(t *testing.T, ctx context.Context, args ...string) (string, error, map[string]any) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.json")
	var stdout, stderr bytes.Buffer
	err := Run(ctx, append(args, "--json", out, "--json-requests"), &stdout, &stderr)
	var m map[string]any
	if b, rerr := os.ReadFile(out); rerr == nil {
		if jerr := json.Unmarshal(b, &m); jerr != nil {
			t.Fatalf("--json does not parse: %v", jerr)
		}
	}
	return stdout.String(), err, m
}

func results(t *testing.T, m map[string]any) []map[string]any {
	t.Helper()
	rs, ok := m["results"].([]any)
	if !ok {
		t.Fatalf("no results in %v", m)
	}
	var out []map[string]any
	for _, r := range rs {
		out = append(out, r.(map[string]any))
	}
	return out
}

func TestRunEndToEnd(t *testing.T) {
	tests := []struct {
		name string
		args []string
		opts fakeOpts
	}{
		{"chat stream", []string{"--endpoint", "chat"}, fakeOpts{itl: time.Millisecond}},
		{"completions stream", []string{"--endpoint", "completions"}, fakeOpts{}},
		{"chat non-stream", []string{"--stream=false"}, fakeOpts{}},
		{"poisson rate", []string{"--request-rate", "400", "--warmup", "2"}, fakeOpts{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeServer(t, tt.opts)
			args := append([]string{"--url", srv.URL(), "--num-prompts", "20", "--concurrency", "4",
				"--input-len", "30", "--output-len", "10", "--quiet"}, tt.args...)
			stdout, err, m := runBench(t, context.Background(), args...)
			if err != nil {
				t.Fatal(err)
			}
			r := results(t, m)[0]
			if r["completed"] != 20.0 || r["failed"] != 0.0 || r["output_tokens"] != 200.0 {
				t.Errorf("completed %v failed %v tokens %v", r["completed"], r["failed"], r["output_tokens"])
			}
			if r["requests_per_s"].(float64) <= 0 || r["output_tokens_per_s"].(float64) <= 0 {
				t.Errorf("throughput missing: %v", r)
			}
			if n := len(m["requests"].([]any)); n != 20 {
				t.Errorf("%d request records, want 20", n)
			}
			for _, want := range []string{"Successful requests:", "20", "TTFT (ms)", "E2E latency (ms)", "Output token throughput"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("report lacks %q:\n%s", want, stdout)
				}
			}
			prompts, bodies := srv.seen()
			if len(prompts) < 20 {
				t.Fatalf("server saw %d requests", len(prompts))
			}
			body := bodies[len(bodies)-1]
			if body["max_tokens"] != 10.0 || body["ignore_eos"] != true || body["model"] != "llama-8b" {
				t.Errorf("request body %v", body)
			}
		})
	}
}

// --url with several base URLs (gateways of one deployment): requests take
// them in turn, and the report counts them as one target.
func TestRunSeveralURLs(t *testing.T) {
	order := &orderLog{}
	a := newFakeServer(t, fakeOpts{name: "a", order: order})
	b := newFakeServer(t, fakeOpts{name: "b", order: order})
	_, err, m := runBench(t, context.Background(), "--url", a.URL()+","+b.URL(), "--num-prompts", "20",
		"--concurrency", "4", "--output-len", "3", "--warmup", "0", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if r := results(t, m)[0]; r["completed"] != 20.0 || r["failed"] != 0.0 {
		t.Fatalf("completed %v failed %v", r["completed"], r["failed"])
	}
	n := map[string]int{}
	for _, s := range order.get() {
		n[s]++
	}
	if n["a"] != 10 || n["b"] != 10 {
		t.Fatalf("requests per server %v, want 10 each", n)
	}
}

func TestRunCountsErrorsByKind(t *testing.T) {
	srv := newFakeServer(t, fakeOpts{mode: "nodone"})
	stdout, err, m := runBench(t, context.Background(), "--url", srv.URL(), "--num-prompts", "5", "--output-len", "3", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "all 5 requests failed") {
		t.Errorf("err = %v, want all failed", err)
	}
	r := results(t, m)[0]
	if errs := r["errors"].(map[string]any); errs["protocol_missing_done"] != 5.0 {
		t.Errorf("errors %v", errs)
	}
	if !strings.Contains(stdout, "protocol_missing_done") {
		t.Errorf("report lacks the error kind:\n%s", stdout)
	}
}

func TestRunCompare(t *testing.T) {
	target := newFakeServer(t, fakeOpts{ttft: 40 * time.Millisecond})
	baseline := newFakeServer(t, fakeOpts{})
	plot := filepath.Join(t.TempDir(), "cmp.png")
	stdout, err, m := runBench(t, context.Background(), "--url", target.URL(), "--compare-url", baseline.URL(),
		"--num-prompts", "16", "--concurrency", "4", "--rounds", "4", "--output-len", "5", "--quiet", "--plot", plot)
	if err != nil {
		t.Fatal(err)
	}
	rs := results(t, m)
	if len(rs) != 2 || rs[0]["name"] != "target" || rs[1]["name"] != "baseline" {
		t.Fatalf("results %v", rs)
	}
	// same prompts on both sides
	tp, _ := target.seen()
	bp, _ := baseline.seen()
	slices.Sort(tp)
	slices.Sort(bp)
	if !slices.Equal(tp, bp) || len(tp) != 16 {
		t.Errorf("target and baseline saw different prompts (%d, %d)", len(tp), len(bp))
	}
	cmp := m["comparison"].(map[string]any)
	added := cmp["added_ttft_p50_ms"].(float64)
	if added < 20 {
		t.Errorf("added TTFT p50 = %v ms, want >= 20 (target has +40 ms)", added)
	}
	rows := map[string]map[string]any{}
	for _, r := range cmp["rows"].([]any) {
		row := r.(map[string]any)
		rows[row["metric"].(string)] = row
	}
	if r := rows["TTFT p50"]; r == nil || r["ratio"].(float64) <= 1 || r["diff"].(float64) < 20 {
		t.Errorf("TTFT p50 row %v", r)
	}
	if r := rows["output throughput"]; r == nil || r["ratio"].(float64) <= 0 {
		t.Errorf("throughput row %v", r)
	} else if _, has := r["diff"]; has {
		t.Errorf("throughput row has a diff: %v", r)
	}
	for _, want := range []string{"target vs baseline", "target/baseline", "Added TTFT (target - baseline): p50 +"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	checkPNG(t, plot)
}

// TestCompareInterleaves checks the round order: A B, B A, A B, B A.
func TestCompareInterleaves(t *testing.T) {
	order := &orderLog{}
	a := newFakeServer(t, fakeOpts{name: "A", order: order})
	b := newFakeServer(t, fakeOpts{name: "B", order: order})
	_, err, _ := runBench(t, context.Background(), "--url", a.URL(), "--compare-url", b.URL(),
		"--num-prompts", "4", "--concurrency", "1", "--rounds", "4", "--output-len", "2", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order.get(), " "), "A B B A A B B A"; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
	pa, _ := a.seen()
	pb, _ := b.seen()
	if !slices.Equal(pa, []string{pb[0], pb[1], pb[2], pb[3]}) {
		t.Errorf("rounds sent different prompts: %q vs %q", pa, pb)
	}
}

func TestRunPlot(t *testing.T) {
	srv := newFakeServer(t, fakeOpts{itl: 2 * time.Millisecond})
	plot := filepath.Join(t.TempDir(), "p.png")
	_, err, _ := runBench(t, context.Background(), "--url", srv.URL(), "--num-prompts", "12", "--output-len", "20", "--quiet", "--plot", plot)
	if err != nil {
		t.Fatal(err)
	}
	checkPNG(t, plot)
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
		t.Errorf("size %v", b)
	}
	fi, _ := f.Stat()
	if fi.Size() < 10<<10 {
		t.Errorf("PNG only %d bytes", fi.Size())
	}
	// the first series' colour is drawn
	n := 0
	for y := 0; y < plotH; y++ {
		for x := 0; x < plotW; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if r>>8 == 31 && g>>8 == 119 && b>>8 == 180 {
				n++
			}
		}
	}
	if n < 500 {
		t.Errorf("only %d pixels of the target's colour", n)
	}
}

func TestRunCancelPrintsPartialReport(t *testing.T) {
	hold := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv := newFakeServer(t, fakeOpts{hold: hold, arrived: arrived})
	defer close(hold)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	stdout, err, m := runBench(t, ctx, "--url", srv.URL(), "--num-prompts", "50", "--concurrency", "2", "--quiet")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if !strings.Contains(stdout, "interrupted") || m["interrupted"] != true {
		t.Errorf("no partial report:\n%s", stdout)
	}
	r := results(t, m)[0]
	if r["cancelled"].(float64) < 1 || r["sent"].(float64) >= 50 {
		t.Errorf("cancelled %v sent %v", r["cancelled"], r["sent"])
	}
}

func TestRunDurationCap(t *testing.T) {
	hold := make(chan struct{})
	srv := newFakeServer(t, fakeOpts{hold: hold})
	defer close(hold)
	start := time.Now()
	_, _, m := runBench(t, context.Background(), "--url", srv.URL(), "--num-prompts", "50", "--concurrency", "3",
		"--duration", "200ms", "--quiet")
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("run took %v with --duration 200ms", el)
	}
	r := results(t, m)[0]
	if r["cancelled"] != 3.0 || r["sent"] != 3.0 || r["completed"] != 0.0 {
		t.Errorf("sent %v cancelled %v completed %v, want 3 3 0", r["sent"], r["cancelled"], r["completed"])
	}
}

func TestRunDataset(t *testing.T) {
	srv := newFakeServer(t, fakeOpts{})
	path := filepath.Join(t.TempDir(), "d.jsonl")
	data := `{"prompt": "alpha beta", "output_len": 3}
{"messages": [{"role": "user", "content": "gamma"}], "output_len": 5}
`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err, m := runBench(t, context.Background(), "--url", srv.URL(), "--dataset", path, "--num-prompts", "0", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if r := results(t, m)[0]; r["completed"] != 2.0 || r["output_tokens"] != 8.0 {
		t.Errorf("completed %v tokens %v", r["completed"], r["output_tokens"])
	}
	prompts, _ := srv.seen()
	slices.Sort(prompts)
	if len(prompts) != 2 || !strings.Contains(prompts[0], `"alpha beta"`) || !strings.Contains(prompts[1], `"gamma"`) {
		t.Errorf("prompts %q", prompts)
	}
}

// Argument errors are found before anything is dialed: each bad command
// line fails with its own message, and the target (a listener that resets
// every connection, held by the test) sees no connection.
func TestHelpAndFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), []string{"--help"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--url", "--compare-url", "TOKENBUS_REQUEST_RATE", "target"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
	target := testenv.ResetListener(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--endpoint", "nope"}, `--endpoint must be chat, completions or embeddings, not "nope"`},
		{[]string{"--endpoint", "embeddings", "--adapters", "2"}, "--adapters works with chat and completions only"},
		{[]string{"--concurrency", "0"}, "--concurrency must be at least 1"},
		{[]string{"--request-rate", "-1"}, "--request-rate must be >= 0"},
		{[]string{"--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"--nope"}, "unknown flag: --nope"},
		{[]string{"stray"}, "unexpected arguments: stray"},
	} {
		args := append(tc.args, "--url", "http://"+target.Addr+"/v1", "--quiet")
		if err := Run(context.Background(), args, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%q): %v, want %q", tc.args, err, tc.want)
		}
	}
	if n := target.Accepted(); n != 0 {
		t.Errorf("%d connections to the target: a command line was not refused before dialing", n)
	}
	// Valid, and what it means: embeddings are never streamed.
	cfg, err := parse([]string{"--endpoint", "embeddings"}, &stdout, &stderr)
	if err != nil || cfg == nil || cfg.endpoint != "embeddings" || cfg.stream {
		t.Errorf("--endpoint embeddings: %+v, %v; want valid, not streamed", cfg, err)
	}
}

func TestEnvFallback(t *testing.T) {
	srv := newFakeServer(t, fakeOpts{})
	t.Setenv("TOKENBUS_URL", srv.URL())
	t.Setenv("TOKENBUS_NUM_PROMPTS", "3")
	t.Setenv("TOKENBUS_MODEL", "from-env")
	_, err, m := runBench(t, context.Background(), "--output-len", "2", "--quiet", "--num-prompts", "4")
	if err != nil {
		t.Fatal(err)
	}
	if r := results(t, m)[0]; r["completed"] != 4.0 || r["model"] != "from-env" {
		t.Errorf("completed %v model %v: flag should beat env, env should beat default", r["completed"], r["model"])
	}
}

func TestProgressNotTTY(t *testing.T) {
	srv := newFakeServer(t, fakeOpts{})
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), []string{"--url", srv.URL(), "--num-prompts", "3", "--output-len", "2", "--warmup", "1"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), "\r") {
		t.Errorf("carriage returns on a non-terminal: %q", stderr.String())
	}
	if !strings.Contains(stderr.String(), "warming up target") {
		t.Errorf("stderr %q", stderr.String())
	}
}

// BenchmarkReadStream measures the client's cost per streamed chunk.
func BenchmarkReadStream(b *testing.B) {
	srv := newDefectServer(b, defectServer{})
	c := &caller{urls: []string{srv.URL() + "/chat/completions"}, chat: true, stream: true, usage: true,
		timeout: time.Minute, client: &http.Client{Transport: newTransport(4)}, maxChunks: 1001}
	body := buildBody(promptSpec{prompt: "x", outputLen: 1000}, "m", "chat", true, true, true)
	b.ReportAllocs()
	for b.Loop() {
		var rec record
		c.do(context.Background(), body, &rec)
		if rec.Err != "" {
			b.Fatal(rec.Err, rec.ErrMsg)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/chunk")
}

// BenchmarkParseStream measures the client's CPU per chunk without a network:
// a recorded 1000-chunk chat stream read from memory.
func BenchmarkParseStream(b *testing.B) {
	var sse bytes.Buffer
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for range 1000 {
		sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}` + "\n\n")
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1000,"total_tokens":1009}}` + "\n\n")
	sse.WriteString("data: [DONE]\n\n")
	raw := sse.Bytes()
	c := &caller{chat: true, stream: true, usage: true, maxChunks: 1001}
	hdr := http.Header{"Content-Type": {"text/event-stream"}}
	ctx := context.Background()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var rec record
		resp := &http.Response{StatusCode: 200, Header: hdr, Body: io.NopCloser(bytes.NewReader(raw))}
		c.readStream(ctx, ctx, func() {}, time.Now(), resp, &rec)
		if rec.Err != "" || rec.Tokens != 1000 {
			b.Fatal(rec.Err, rec.ErrMsg, rec.Tokens)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/chunk")
}

// --endpoint embeddings: one input per request, in base64 as the SDKs ask,
// never streamed; the answer is checked and its prompt tokens counted.
func TestRunEmbeddings(t *testing.T) {
	srv := newFakeServer(t, fakeOpts{})
	srv.fake.Pooling = true
	stdout, err, m := runBench(t, context.Background(), "--url", srv.URL(), "--endpoint", "embeddings", "--num-prompts", "12",
		"--concurrency", "3", "--input-len", "20", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	r := results(t, m)[0]
	if r["completed"] != 12.0 || r["failed"] != 0.0 || r["output_tokens"] != 0.0 || r["input_tokens"].(float64) <= 0 || r["stream"] != false {
		t.Errorf("completed %v failed %v output %v input %v stream %v", r["completed"], r["failed"], r["output_tokens"], r["input_tokens"], r["stream"])
	}
	if !strings.Contains(stdout, "Successful requests:") {
		t.Errorf("report:\n%s", stdout)
	}
	got := srv.fake.Received()
	var body map[string]any
	if len(got) != 12 || got[0].Path != "/v1/embeddings" || json.Unmarshal(got[0].Body, &body) != nil ||
		body["encoding_format"] != "base64" || body["input"] == "" || body["model"] != "llama-8b" || len(body) != 3 {
		t.Fatalf("the server got %d requests, first %s %s", len(got), got[0].Path, got[0].Body)
	}

	// A server that cannot embed: every request fails, by status.
	gen := newFakeServer(t, fakeOpts{})
	_, err, m = runBench(t, context.Background(), "--url", gen.URL(), "--endpoint", "embeddings", "--num-prompts", "3", "--quiet")
	if r := results(t, m)[0]; err == nil && r["failed"] != 3.0 {
		t.Errorf("against a generative model: failed %v, err %v", r["failed"], err)
	}
}

// --prefix-groups: G system prompts, each on num-prompts/G questions, in
// shuffled order; in completions the prefix starts the prompt.
func TestPrefixGroups(t *testing.T) {
	ps := randomPrompts(3, 1, 48, 40, 10, 7, 4, "chat")
	count := map[string]int{}
	var order []string
	for _, p := range ps {
		var msgs []chatMessage
		if err := json.Unmarshal(p.messages, &msgs); err != nil || len(msgs) != 2 || msgs[0].Role != "system" || msgs[1].Role != "user" {
			t.Fatalf("messages %s", p.messages)
		}
		if n := len(strings.Fields(msgs[0].Content)); n != 40 {
			t.Fatalf("system prompt of %d words", n)
		}
		count[msgs[0].Content]++
		order = append(order, msgs[0].Content)
	}
	if len(count) != 4 {
		t.Fatalf("%d distinct system prompts, want 4", len(count))
	}
	for _, n := range count {
		if n != 12 {
			t.Fatalf("counts %v, want 12 each", count)
		}
	}
	roundRobin := true
	for i := range order {
		if order[i] != order[i%4] {
			roundRobin = false
		}
	}
	if roundRobin {
		t.Fatal("prompts not shuffled")
	}
	for _, p := range randomPrompts(3, 1, 8, 40, 10, 7, 2, "completions") {
		if p.messages != nil || len(strings.Fields(p.prompt)) != 50 {
			t.Fatalf("completion prompt %.60q (messages %s)", p.prompt, p.messages)
		}
	}
}

func TestErrorCode(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"error":{"message":"wait","type":"overloaded","code":"queue_wait_too_long"}}`, "queue_wait_too_long"},
		{`{"error":{"message":"boom","type":"x","param":null,"code":null}}`, ""},
		{`{"error":{"message":"nested","code":503}}`, "503"},
		{`{"object":"error","message":"old vllm","code":400}`, "400"},
		{`{"error":"flat"}`, ""},
		{"plain text\n", ""},
	}
	for _, tt := range tests {
		if got := errorCode([]byte(tt.body)); got != tt.want {
			t.Errorf("errorCode(%s) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

// A refused request's error code and Retry-After reach --json, per request
// and counted in the summary, and the load clock's start is there to line
// up the runs of separate bench processes.
func TestRefusalsInJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"would wait too long","type":"overloaded","code":"queue_wait_too_long"}}`)
	}))
	defer srv.Close()
	before := float64(time.Now().UnixMicro()) / 1e6
	_, err, m := runBench(t, context.Background(), "--url", srv.URL+"/v1", "--num-prompts", "3", "--concurrency", "1",
		"--input-len", "5", "--output-len", "5", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "all 3 requests failed") {
		t.Errorf("err = %v, want all 3 requests failed (and the JSON written all the same)", err)
	}
	r := results(t, m)[0]
	if codes, _ := r["error_codes"].(map[string]any); codes["http_503 queue_wait_too_long"] != 3.0 {
		t.Errorf("error_codes = %v, want 3 of http_503 queue_wait_too_long", r["error_codes"])
	}
	if at, _ := r["load_start_unix_s"].(float64); at < before || at > float64(time.Now().UnixMicro())/1e6 {
		t.Errorf("load_start_unix_s = %v, not within the run (began after %v)", r["load_start_unix_s"], before)
	}
	reqs, _ := m["requests"].([]any)
	if len(reqs) != 3 {
		t.Fatalf("%d request records, want 3", len(reqs))
	}
	for _, q := range reqs {
		q := q.(map[string]any)
		if q["error"] != "http_503" || q["error_code"] != "queue_wait_too_long" || q["retry_after"] != "2" || q["chunks"] != 0.0 {
			t.Errorf("request record %v", q)
		}
	}
}
