package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Capacity on demand end to end (docs/capacity.md): requests for a
// registered model with no worker wait for one instead of a 503.

// coldStartDelay is how long after the first request the scale-from-zero
// test starts the first worker: the 10 s.
const coldStartDelay = 10 * time.Second

// rawStream is one streamed request read byte for byte.
type rawStream struct {
	status   int
	ttft     time.Duration // to the first data line
	comments int           // SSE comment lines before it
	before   string        // anything else before it (must stay empty)
	chunks   int
	done     bool // data: [DONE] came
	errLine  string
	err      error
}

// streamRaw posts a streamed chat request with net/http and reads the SSE
// body line by line, so that what comes before the first token is seen as
// sent.
func streamRaw(ctx context.Context, base, model string) rawStream {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":8,"messages":[{"role":"user","content":"cold"}]}`, model)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rawStream{err: err}
	}
	defer resp.Body.Close()
	r := rawStream{status: resp.StatusCode}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, ":") && r.chunks == 0:
			r.comments++
		case line == "data: [DONE]":
			r.done = true
		case strings.HasPrefix(line, `data: {"error"`):
			r.errLine = line
		case strings.HasPrefix(line, "data: "):
			if r.chunks == 0 {
				r.ttft = time.Since(start)
			}
			r.chunks++
		case r.chunks == 0:
			r.before += line + "\n"
		}
	}
	r.err = sc.Err()
	return r
}

// TestScaleFromZero is the scale-from-zero target: a registered
// model with no worker; 50 concurrent requests (25 streamed) arrive; the
// first worker starts 10 s later. Every request succeeds, none is refused,
// no stream carries anything but SSE comments before its first token, the
// demand shows (gauge and event) within 1 s of the first request, and the
// time to first token is the worker's start plus the usual. The official
// Python and Node SDKs, with their default timeouts, wait through the same
// cold start.
func TestScaleFromZero(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a 10 s cold start")
	}
	t.Parallel()
	rd := testenv.StartRedis(t)
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL = rd.URL
		c.SimWorkers = 0 // dev registers the sim's model all the same
	})
	const model = "llama-8b"

	// The demand event: watched on the bus like an autoscaler would.
	nc := connectNATS(t, d.NATSURL)
	firstDemand := make(chan time.Time, 1)
	sub, err := nc.Subscribe(schemas.DemandPrefix+">", func(m *nats.Msg) {
		var ev schemas.Demand
		if json.Unmarshal(m.Data, &ev) == nil && ev.Model == model && ev.Waiting > 0 {
			select {
			case firstDemand <- time.Now():
			default:
			}
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
	// The SDKs' scripts, when installed (scripts/test installs them).
	type sdkRun struct {
		name, env, script, ok string
		out                   string
		err                   error
	}
	sdks := []*sdkRun{
		{name: "python", env: "TOKENBUS_TEST_PYTHON", script: "clients/cold_start.py", ok: "python cold start ok"},
		{name: "node", env: "TOKENBUS_TEST_NODE", script: "clients/cold_start.mjs", ok: "node cold start ok"},
	}
	var wg sync.WaitGroup
	for _, s := range sdks {
		bin := os.Getenv(s.env)
		if bin == "" {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not set: run the tests with scripts/test, which installs the SDK", s.env)
			}
			t.Logf("%s not set: the %s SDK's cold start is not checked", s.env, s.name)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.out, s.err = runScript(ctx, bin, s.script, d.URL, model)
		}()
	}

	start := time.Now()
	raws := make([]rawStream, 13)
	var sdkStreams [12]error
	var plains [25]error
	var sdkStreamTokens [12]int
	for i := range raws {
		wg.Add(1)
		go func() { defer wg.Done(); raws[i] = streamRaw(ctx, d.URL, model) }()
	}
	// openai-go with its defaults (retries included, no timeout of its own).
	c := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey("unused"))
	for i := range sdkStreamTokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(8),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("cold")}})
			for st.Next() {
				if ch := st.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
					sdkStreamTokens[i]++
				}
			}
			sdkStreams[i] = st.Err()
		}()
	}
	for i := range plains {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(8),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("cold")}})
			if err == nil && (len(r.Choices) == 0 || r.Usage.CompletionTokens != 8) {
				err = fmt.Errorf("answer %+v", r)
			}
			plains[i] = err
		}()
	}

	// Demand within 1 s: the event, and the gauge an autoscaler scrapes.
	select {
	case at := <-firstDemand:
		if took := at.Sub(start); took > time.Second {
			t.Errorf("the first demand event came %v after the first request, want within 1s", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no demand event")
	}
	testenv.WaitFor(t, time.Second, func() error {
		if v := metricValue(t, d.URL, `tokenbus_dispatcher_capacity_waiting{model="llama-8b"}`); v < 1 {
			return fmt.Errorf("capacity_waiting %v", v)
		}
		return nil
	})

	// The first worker, 10 s after the first request.
	<-time.After(time.Until(start.Add(coldStartDelay))) // the scenario's delay, not a wait for a condition
	wc := program.DefaultWorker()
	wc.NATS.URL, wc.Redis.URL, wc.Worker.ID = d.NATSURL, rd.URL, "late-worker"
	wc.Worker.MaxConcurrency = 64
	w, err := program.StartWorker(context.Background(), wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	workerUp := time.Since(start)
	wg.Wait()

	for i, r := range raws {
		switch {
		case r.err != nil || r.status != 200:
			t.Errorf("raw stream %d: status %d, %v", i, r.status, r.err)
		case r.before != "":
			t.Errorf("raw stream %d: before its first token it carried %q (only SSE comments may come)", i, r.before)
		case r.errLine != "" || !r.done || r.chunks == 0:
			t.Errorf("raw stream %d: %d chunks, done %v, error %s", i, r.chunks, r.done, r.errLine)
		case r.comments == 0:
			t.Errorf("raw stream %d: no SSE keep-alive comment in a %v wait", i, r.ttft)
		case r.ttft < workerUp-time.Second || r.ttft > workerUp+3*time.Second:
			t.Errorf("raw stream %d: first token after %v; the worker came up at %v", i, r.ttft, workerUp)
		}
	}
	for i, err := range sdkStreams {
		if err != nil || sdkStreamTokens[i] == 0 {
			t.Errorf("openai-go stream %d: %d tokens, %v", i, sdkStreamTokens[i], err)
		}
	}
	for i, err := range plains {
		if err != nil {
			t.Errorf("openai-go request %d: %v", i, err)
		}
	}
	for _, s := range sdks {
		if s.out == "" && s.err == nil {
			continue // not installed
		}
		if s.err != nil || !strings.Contains(s.out, s.ok) {
			t.Errorf("%s SDK: %v\n%s", s.name, s.err, s.out)
		} else {
			t.Logf("%s", strings.TrimSpace(s.out))
		}
	}
	if v := metricValue(t, d.URL, `tokenbus_dispatcher_capacity_waiting{model="llama-8b"}`); v != 0 {
		t.Errorf("capacity_waiting %v after every request was served", v)
	}
	if v := metricValue(t, d.URL, `tokenbus_dispatcher_rejected_total{reason="no_worker"}`); v != 0 {
		t.Errorf("%v requests refused no_worker", v)
	}
	var ttfts []string
	for _, r := range raws {
		ttfts = append(ttfts, r.ttft.Round(10*time.Millisecond).String())
	}
	t.Logf("worker up at %v; raw streams' time to first token: %s", workerUp.Round(10*time.Millisecond), strings.Join(ttfts, " "))
}

// runScript runs an SDK script with its interpreter.
func runScript(ctx context.Context, bin, script string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, append([]string{script}, args...)...).CombinedOutput()
	return string(out), err
}

// TestHeldRequestsSurviveDispatcherKill: requests held for capacity in two
// standalone dispatchers (separate processes); kill -9 the one holding
// some: its requests' clients hear no beat, send them again (to the
// other), and when the first worker comes up every request is served.
func TestHeldRequestsSurviveDispatcherKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and a kill -9")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	rd, store := startStore(t)
	if _, err := store.PutBase(context.Background(), registry.Model{Name: "llama-8b"}); err != nil {
		t.Fatal(err)
	}
	natsURL, httpPort := procNATS(t), testenv.FreePort(t)
	common := []string{"--nats-url", natsURL, "--redis-url", rd.URL}
	nc := connectNATS(t, natsURL)
	var mu sync.Mutex
	waiting := map[string]int{} // by dispatcher: its latest demand event's count
	if _, err := nc.Subscribe(schemas.DemandPrefix+">", func(m *nats.Msg) {
		var ev schemas.Demand
		if json.Unmarshal(m.Data, &ev) == nil {
			mu.Lock()
			waiting[ev.Dispatcher] = ev.Waiting
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ds := map[string]*proc{}
	for _, id := range []string{"d1", "d2"} {
		ds[id] = startProc(t, id, bin, append([]string{"dispatcher", "--dispatcher-id", id}, common...)...)
	}
	startProc(t, "gateway", bin, append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--auth=false",
		"--admin", "", "--embed-dispatcher=false"}, common...)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitPath(t, base, "/health")
	waitDispatchers(t, natsURL, 2)

	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = streamSome(ctx, c, fmt.Sprintf("held %d", i)) })
	}
	held := func() (d1, d2 int) {
		mu.Lock()
		defer mu.Unlock()
		return waiting["d1"], waiting["d2"]
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		if a, b := held(); a+b != n {
			return fmt.Errorf("held: d1 %d, d2 %d", a, b)
		}
		return nil
	})
	victim, other := "d1", "d2"
	if a, _ := held(); a == 0 {
		victim, other = "d2", "d1"
	}
	a, b := held()
	t.Logf("held before the kill: d1 %d, d2 %d; killing %s", a, b, victim)
	killed := time.Now()
	ds[victim].kill9(t)
	// Its clients hear no beat and send their requests again: the other
	// dispatcher holds them all.
	testenv.WaitFor(t, 15*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if waiting[other] != n {
			return fmt.Errorf("%s holds %d of %d", other, waiting[other], n)
		}
		return nil
	})
	t.Logf("%s held all %d requests %v after the kill", other, n, time.Since(killed).Round(100*time.Millisecond))
	startProc(t, "worker", bin, append([]string{"worker", "--id", "w1", "--sim-decode-base", "5ms"}, common...)...)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
}

// A held stream that reaches the cold-start timeout after it began (its
// SSE comments) ends with the error in-band, then [DONE]; one that has
// not begun yet gets the error's status. A model nobody registered is a 404
// at once.
func TestHeldStreamTimesOut(t *testing.T) {
	t.Parallel()
	rd := testenv.StartRedis(t)
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL, c.SimWorkers = rd.URL, 0
		c.Dispatcher.ColdStartTimeout = 1500 * time.Millisecond
		c.HTTP.HoldKeepalive = 300 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := streamRaw(ctx, d.URL, "llama-8b")
	if r.err != nil || r.status != 200 || r.comments == 0 || r.chunks != 0 || !r.done || r.before != "" ||
		!strings.Contains(r.errLine, `"code":"cold_start_timeout"`) {
		t.Fatalf("held stream past the cold-start timeout: %+v", r)
	}
	s := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","max_tokens":4,"messages":[{"role":"user","content":"x"}]}`)
	if e := errorBody(t, s.Body); s.Status != 503 || e.Code == nil || *e.Code != "cold_start_timeout" {
		t.Fatalf("held request past the cold-start timeout: %d %s", s.Status, s.Body)
	}
	start := time.Now()
	s = post(t, d.URL, "/v1/chat/completions", `{"model":"never-registered","max_tokens":4,"messages":[{"role":"user","content":"x"}]}`)
	if s.Status != 404 || time.Since(start) > time.Second {
		t.Fatalf("unregistered model: %d after %v: %s", s.Status, time.Since(start), s.Body)
	}
}

// TestWorkerKilledWhileWaking: two sim workers (separate processes) asleep
// (--sleep-after) with a 3 s wake-up; requests arrive and go to one of them
// (both sleep: a wake-up away); kill -9 that worker while it wakes. The
// gateway's client hears the worker is gone and sends each request again to
// the other, which wakes and serves it: every request succeeds.
func TestWorkerKilledWhileWaking(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and a kill -9")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	rd := testenv.StartRedis(t)
	natsURL, httpPort := procNATS(t), testenv.FreePort(t)
	common := []string{"--nats-url", natsURL, "--redis-url", rd.URL}
	hb := watchHeartbeats(t, natsURL)
	ws := map[string]*proc{}
	for _, id := range []string{"w1", "w2"} {
		ws[id] = startProc(t, id, bin, append([]string{"worker", "--id", id, "--sleep-after", "300ms", "--sim-wake-time", "3s",
			"--sim-decode-base", "5ms"}, common...)...)
	}
	startProc(t, "gateway", bin, append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--auth=false",
		"--admin", ""}, common...)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitPath(t, base, "/health")
	asleep := func(id string) bool {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		return hb.last[id].Sleeping
	}
	testenv.WaitFor(t, 15*time.Second, func() error {
		if !asleep("w1") || !asleep("w2") {
			return fmt.Errorf("not both asleep yet")
		}
		return nil
	})

	const n = 8
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = streamSome(ctx, c, fmt.Sprintf("wake %d", i)) })
	}
	// A worker that took some of them is waking up (its heartbeat says
	// sleeping until the wake-up ends, with requests running): kill it
	// mid-wake.
	var victim string
	testenv.WaitFor(t, 2*time.Second, func() error {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		for _, id := range []string{"w1", "w2"} {
			if b := hb.last[id]; b.Sleeping && b.Running > 0 {
				victim = id
				return nil
			}
		}
		return fmt.Errorf("no worker waking with requests: %+v", hb.last)
	})
	ws[victim].kill9(t)
	killed := time.Now()
	wg.Wait()
	t.Logf("killed %s while it woke up; every request done %v later", victim, time.Since(killed).Round(100*time.Millisecond))
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
}

// A Responses stream held for capacity begins with its first events
// (response.created, response.in_progress) and SSE comments until its first
// token, then goes on as usual; the official Go SDK reads it whole.
func TestHeldResponsesStream(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a 2 s cold start")
	}
	t.Parallel()
	rd := testenv.StartRedis(t)
	d := startDev(t, func(c *program.DevConfig) {
		c.Redis.URL, c.SimWorkers = rd.URL, 0
		c.HTTP.HoldKeepalive = 300 * time.Millisecond
	})
	// Byte for byte: only events and comments before the first token.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := `{"model":"llama-8b","stream":true,"max_output_tokens":8,"input":"cold"}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.URL+"/v1/responses", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	go func() { // the worker, once the stream has begun
		<-time.After(2 * time.Second)
		wc := program.DefaultWorker()
		wc.NATS.URL, wc.Redis.URL, wc.Worker.ID = d.NATSURL, rd.URL, "late-responses"
		w, err := program.StartWorker(context.Background(), wc)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { _ = w.Close() })
	}()
	sc := bufio.NewScanner(resp.Body)
	var comments int
	var types []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			if !slices.Contains(types, "response.output_text.delta") {
				comments++
			}
		case strings.HasPrefix(line, "event: "):
			types = append(types, strings.TrimPrefix(line, "event: "))
		}
	}
	took := time.Since(start)
	if comments == 0 || len(types) < 3 || types[0] != "response.created" || types[1] != "response.in_progress" ||
		!slices.Contains(types, "response.output_text.delta") || types[len(types)-1] != "response.incomplete" { // max_output_tokens reached
		t.Fatalf("held responses stream: %d comments, events %v", comments, types)
	}
	if took < 2*time.Second {
		t.Fatalf("done after %v, before the worker started", took)
	}
}

// streamSome streams a chat completion of 8 tokens of llama-8b through c:
// nil when it ended well with content.
func streamSome(ctx context.Context, c openai.Client, prompt string) error {
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}})
	tokens := 0
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			tokens++
		}
	}
	if err := st.Err(); err != nil {
		return err
	}
	if tokens == 0 {
		return fmt.Errorf("no tokens")
	}
	return nil
}

// procNATS starts nats-server as a process of its own on ports picked
// now, and returns its URL once it takes connections (its monitoring
// endpoint: natsMonitor).
func procNATS(t *testing.T) string {
	t.Helper()
	// A port free a moment ago may be taken before nats-server binds it
	// (an outgoing connection of another test gets it as its local port):
	// then the server exits, and it is started again on new ports.
	for attempt := 1; ; attempt++ {
		port, mon := testenv.FreePort(t), testenv.FreePort(t)
		p := startProc(t, "nats-server", natsServer(t), "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mon))
		url := fmt.Sprintf("nats://127.0.0.1:%d", port)
		exited := false
		testenv.WaitFor(t, 10*time.Second, func() error {
			select {
			case err := <-p.done:
				p.done <- err
				exited = true
				return nil
			default:
			}
			nc, err := nats.Connect(url)
			if err == nil {
				nc.Close()
			}
			return err
		})
		if !exited {
			natsMonitors.Store(url, fmt.Sprintf("http://127.0.0.1:%d", mon))
			return url
		}
		if attempt == 3 {
			t.Fatal("nats-server exited at start three times (ports taken?)")
		}
	}
}

// natsMonitors: the monitoring endpoint of each nats-server procNATS
// started, by its URL.
var natsMonitors sync.Map

// waitDispatchers waits until n dispatchers have subscribed to the request
// subjects in their queue group on the nats-server at url (its /subsz):
// before that, a request gets no_dispatcher.
func waitDispatchers(t *testing.T, url string, n int) {
	t.Helper()
	mon, ok := natsMonitors.Load(url)
	if !ok {
		t.Fatalf("%s was not started by procNATS", url)
	}
	testenv.WaitFor(t, 15*time.Second, func() error {
		resp, err := http.Get(mon.(string) + "/subsz?subs=1&test=" + schemas.ReqPrefix + "x")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var sz struct {
			Subs []struct {
				Subject string `json:"subject"`
				Queue   string `json:"qgroup"`
			} `json:"subscriptions_list"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&sz); err != nil {
			return err
		}
		got := 0
		for _, s := range sz.Subs {
			if s.Subject == schemas.ReqPrefix+">" && s.Queue == schemas.DispatcherQueue {
				got++
			}
		}
		if got < n {
			return fmt.Errorf("%d dispatchers subscribed, want %d", got, n)
		}
		return nil
	})
}
