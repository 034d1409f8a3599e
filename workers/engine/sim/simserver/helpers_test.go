package simserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// fastSim takes no simulated time; the server tests do not need it.
func fastSim() sim.Config {
	c := sim.DefaultConfig()
	c.Model = "base"
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq, c.AdapterLoadTime = 0, 0, 0, 0, 0
	return c
}

// slowSim decodes a token every few milliseconds, so a stream lasts.
func slowSim() sim.Config {
	c := fastSim()
	c.DecodeBase = 5 * time.Millisecond
	return c
}

type testServer struct {
	*Server
	eng *sim.Engine
	url string
}

func start(t testing.TB, cfg Config, sc sim.Config) *testServer {
	t.Helper()
	eng, err := sim.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, eng, nil)
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		eng.Close()
	})
	return &testServer{Server: s, eng: eng, url: hs.URL}
}

// do makes a request; a body gets Content-Type application/json unless
// headers set one ("" removes it).
func do(t testing.TB, method, url, body string, headers ...string) *http.Response {
	t.Helper()
	return doCtx(t, context.Background(), method, url, body, headers...)
}

func doCtx(t testing.TB, ctx context.Context, method, url, body string, headers ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sse checks the exact framing of an event stream (only "data: <x>\n\n"
// events, the last one [DONE], then the end of the body) and returns the
// payloads before [DONE].
func sse(t testing.TB, resp *http.Response) []string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	body := readAll(t, resp)
	var out []string
	rest := body
	for len(rest) > 0 {
		ev, after, ok := bytes.Cut(rest, []byte("\n\n"))
		if !ok {
			t.Fatalf("unterminated event %q", rest)
		}
		data, found := bytes.CutPrefix(ev, []byte("data: "))
		if !found || bytes.IndexByte(data, '\n') >= 0 {
			t.Fatalf("not a single data line: %q", ev)
		}
		rest = after
		if string(data) == "[DONE]" {
			if len(rest) > 0 {
				t.Fatalf("bytes after [DONE]: %q", rest)
			}
			return out
		}
		if !json.Valid(data) {
			t.Fatalf("not JSON: %q", data)
		}
		out = append(out, string(data))
	}
	t.Fatalf("no [DONE] in %q", body)
	return nil
}

// firstEvent reads the first SSE event of a stream that goes on.
func firstEvent(t testing.TB, resp *http.Response) string {
	t.Helper()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the first event: %v", err)
	}
	return strings.TrimSpace(line)
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// scrape reads /metrics into metric families.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp := do(t, http.MethodGet, url+"/metrics", "")
	body := readAll(t, resp)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return fams
}

// value is the value of the series of name whose labels include want
// (name=value pairs); -1 if there is none.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	for _, m := range f.GetMetric() {
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// wantSim waits until the sim's Stats and Metrics pass ok.
func wantSim(t testing.TB, eng *sim.Engine, ok func(engine.Stats, sim.Metrics) bool) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if st, m := eng.Stats(), eng.Metrics(); !ok(st, m) {
			return fmt.Errorf("stats %+v, metrics %+v", st, m)
		}
		return nil
	})
}

// running waits until the sim runs n sequences.
func running(t testing.TB, eng *sim.Engine, n int) {
	t.Helper()
	wantSim(t, eng, func(st engine.Stats, _ sim.Metrics) bool { return st.Running == n })
}

// aborted waits until the sim runs nothing and has aborted n sequences.
func aborted(t testing.TB, eng *sim.Engine, n int) {
	t.Helper()
	wantSim(t, eng, func(st engine.Stats, m sim.Metrics) bool {
		return st.Running == 0 && m.RequestSuccess["abort"] == uint64(n)
	})
}

func newSim(t testing.TB, sc sim.Config) *sim.Engine {
	t.Helper()
	eng, err := sim.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
