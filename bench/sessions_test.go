package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

func TestHistoryMessages(t *testing.T) {
	users := []string{"u1", "u2", "u3"}
	answers := []string{"a1", `a2 "quoted"`}
	m := func(role, content string) chatMessage { return chatMessage{Role: role, Content: content} }
	tests := []struct {
		name   string
		system string
		k      int
		want   []chatMessage
	}{
		{"first turn", "sys", 0, []chatMessage{m("system", "sys"), m("user", "u1")}},
		{"second turn", "sys", 1, []chatMessage{m("system", "sys"), m("user", "u1"), m("assistant", "a1"), m("user", "u2")}},
		{"third turn", "sys", 2, []chatMessage{m("system", "sys"), m("user", "u1"), m("assistant", "a1"),
			m("user", "u2"), m("assistant", `a2 "quoted"`), m("user", "u3")}},
		{"no system message", "", 1, []chatMessage{m("user", "u1"), m("assistant", "a1"), m("user", "u2")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []chatMessage
			raw := historyMessages(tt.system, users, answers, tt.k)
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// What prefix-aware routing keys on (the raw JSON of messages, in blocks):
// a turn's messages JSON, but for its closing bracket, begins the next
// turn's byte for byte, so the whole history is a shared prefix.
func TestHistoryIsBytePrefix(t *testing.T) {
	users := []string{"first question", "second question", "third question"}
	answers := []string{"an answer with \"quotes\" and \\ and é", "another answer"}
	for k := 0; k < len(users)-1; k++ {
		this, next := historyMessages("be brief", users, answers, k), historyMessages("be brief", users, answers, k+1)
		if !bytes.HasPrefix(next, this[:len(this)-1]) {
			t.Errorf("turn %d: %s\nis not a prefix of turn %d: %s", k+1, this, k+2, next)
		}
	}
}

func TestMakeSessions(t *testing.T) {
	sess := makeSessions(5, 12, 3, 30, 7, 9, 4)
	if len(sess) != 12 {
		t.Fatalf("%d sessions", len(sess))
	}
	systems := map[string]int{}
	var order []string
	for _, s := range sess {
		if len(s.users) != 3 || s.outputLen != 9 || len(strings.Fields(s.system)) != 30 {
			t.Fatalf("session %+v", s)
		}
		for _, u := range s.users {
			if len(strings.Fields(u)) != 7 {
				t.Fatalf("user turn %q", u)
			}
		}
		systems[s.system]++
		order = append(order, s.system)
	}
	if len(systems) != 4 {
		t.Fatalf("%d system prompts, want 4", len(systems))
	}
	for _, n := range systems {
		if n != 3 {
			t.Fatalf("sessions per system prompt %v, want 3 each", systems)
		}
	}
	roundRobin := true
	for i := range order {
		roundRobin = roundRobin && order[i] == order[i%4]
	}
	if roundRobin {
		t.Error("sessions not shuffled")
	}
	again := makeSessions(5, 12, 3, 30, 7, 9, 4)
	for i := range sess {
		if sess[i].system != again[i].system || !slices.Equal(sess[i].users, again[i].users) {
			t.Fatal("same seed, different sessions")
		}
	}
	if one := makeSessions(5, 3, 2, 10, 4, 1, 0); one[0].system != one[1].system || one[1].system != one[2].system {
		t.Error("without groups the sessions should share one system prompt")
	}
	if ph := sessionPlaceholders(sess[:1]); len(ph) != 3 || ph[0].inputEst != 37 || ph[1].inputEst != 37+9+7 {
		t.Errorf("placeholders %+v", ph)
	}
}

func TestTurnStats(t *testing.T) {
	recs := []record{
		{Turn: 1, PromptTokens: 100, E2E: 40e6},
		{Turn: 2, PromptTokens: 200, CachedTokens: 96, E2E: 20e6},
		{Turn: 1, PromptTokens: 100, E2E: 60e6},
		{Turn: 2, PromptTokens: 220, CachedTokens: 112, E2E: 10e6},
		{Turn: 3, PromptTokens: 300, CachedTokens: 192, E2E: 30e6},
		{Turn: 3, Err: "timeout", PromptTokens: 999},
	}
	by, later := turnStats(recs, 3)
	if len(by) != 3 {
		t.Fatalf("%d turns", len(by))
	}
	want := []TurnStats{
		{Turn: 1, Completed: 2, InputTokens: 200, CachedTokens: 0},
		{Turn: 2, Completed: 2, InputTokens: 420, CachedTokens: 208},
		{Turn: 3, Completed: 1, InputTokens: 300, CachedTokens: 192},
	}
	for i, w := range want {
		g := by[i]
		if g.Turn != w.Turn || g.Completed != w.Completed || g.InputTokens != w.InputTokens || g.CachedTokens != w.CachedTokens || g.TTFT.N != w.Completed {
			t.Errorf("turn %d: %+v, want %+v", i+1, g, w)
		}
	}
	if by[0].TTFT.P50 != 50 || by[1].TTFT.Mean != 15 {
		t.Errorf("TTFT turn 1 %+v, turn 2 %+v", by[0].TTFT, by[1].TTFT)
	}
	if later.Completed != 3 || later.InputTokens != 720 || later.CachedTokens != 400 || later.TTFT.N != 3 || later.TTFT.Max != 30 {
		t.Errorf("later turns %+v", later)
	}
	if by, later := turnStats(recs, 0); by != nil || later != nil {
		t.Error("no turns: want nil")
	}
}

func TestSessionFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	target := testenv.ResetListener(t) // refused before dialing: it sees no connection
	for _, args := range [][]string{
		{"--sessions", "2", "--endpoint", "completions"},
		{"--sessions", "2", "--turns", "0"},
		{"--sessions", "2", "--adapters", "3"},
		{"--sessions", "-1"},
		{"--sessions", "2", "--prefix-groups", "2"}, // groups of no system prompt
	} {
		if err := Run(context.Background(), append(args, "--url", "http://"+target.Addr+"/v1", "--quiet"), &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "--") {
			t.Errorf("Run(%v): %v, want a flag error", args, err)
		}
	}
	if n := target.Accepted(); n != 0 {
		t.Errorf("%d connections to the target: a command line was not refused before dialing", n)
	}
}

// exchange is one request the sim answered: its messages and the content
// it streamed back.
type exchange struct {
	messages []chatMessage
	answer   string
}

// recordingSim is a real sim behind tokenbus's sim-server (vLLM's API)
// that records every chat request with the text it answered.
type recordingSim struct {
	mu   sync.Mutex
	seen []exchange
}

// teeWriter keeps a copy of the response body; Flush reaches the server's.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(b []byte) (int, error) { w.buf.Write(b); return w.ResponseWriter.Write(b) }
func (w *teeWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }

func (rs *recordingSim) start(t *testing.T, model string) string {
	eng, err := sim.New(enginetest.SimConfig(model))
	if err != nil {
		t.Fatal(err)
	}
	srv := simserver.New(simserver.Config{}, eng, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
			srv.ServeHTTP(w, r)
			return
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		var req struct {
			Messages []chatMessage `json:"messages"`
		}
		_ = json.Unmarshal(body.Bytes(), &req)
		r.Body = http.NoBody
		r2 := r.Clone(r.Context())
		r2.Body, r2.ContentLength = readCloser{bytes.NewReader(body.Bytes())}, int64(body.Len())
		tw := &teeWriter{ResponseWriter: w}
		srv.ServeHTTP(tw, r2)
		var answer strings.Builder
		var ch schemas.Chunk
		for _, line := range strings.Split(tw.buf.String(), "\n") {
			payload, ok := strings.CutPrefix(line, "data: ")
			if !ok || payload == "[DONE]" || schemas.ReadChunk([]byte(payload), &ch) != nil {
				continue
			}
			for _, c := range ch.Choices {
				answer.WriteString(schemas.String(c.Content))
			}
		}
		rs.mu.Lock()
		rs.seen = append(rs.seen, exchange{req.Messages, answer.String()})
		rs.mu.Unlock()
	}))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		eng.Close()
	})
	return hs.URL + "/v1"
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// Sessions against a real sim: every turn after the first resends the
// previous turn's messages plus the answer the sim actually streamed, the
// turns of a session are sent in order, and the history is served from the
// sim's prefix cache.
func TestRunSessionsSim(t *testing.T) {
	var rs recordingSim
	url := rs.start(t, "sim-model")
	const sessions, turns = 4, 3
	stdout, err, m := runBench(t, context.Background(), "--url", url, "--model", "sim-model", "--sessions", "4", "--turns", "3",
		"--shared-prefix", "64", "--prefix-groups", "4", "--input-len", "12", "--output-len", "8", "--concurrency", "2", "--seed", "3", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	r := results(t, m)[0]
	if r["completed"] != float64(sessions*turns) || r["failed"] != 0.0 {
		t.Fatalf("completed %v failed %v", r["completed"], r["failed"])
	}
	byTurn, _ := r["turns"].([]any)
	later, _ := r["later_turns"].(map[string]any)
	if len(byTurn) != turns || later == nil || later["completed"] != float64(sessions*(turns-1)) {
		t.Fatalf("turns %v later %v", r["turns"], r["later_turns"])
	}
	if c := later["cached_input_tokens"].(float64); c <= 0 || c >= later["input_tokens"].(float64) {
		t.Errorf("later turns: %v of %v input tokens cached; the history should be (the new turn not)", c, later["input_tokens"])
	}
	if first := byTurn[0].(map[string]any); first["cached_input_tokens"] != 0.0 {
		t.Errorf("first turns: %v tokens cached; each session has its own system prompt", first["cached_input_tokens"])
	}
	for _, want := range []string{"By turn", "turn 1", "turn 3", "turns >= 2"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}

	rs.mu.Lock()
	seen := slices.Clone(rs.seen)
	rs.mu.Unlock()
	if len(seen) != sessions*turns {
		t.Fatalf("sim saw %d chat requests, want %d", len(seen), sessions*turns)
	}
	firsts := 0
	for i, ex := range seen {
		n := len(ex.messages)
		if n < 2 || n%2 != 0 || ex.messages[0].Role != "system" || ex.messages[n-1].Role != "user" {
			t.Fatalf("request %d: messages %v", i, ex.messages)
		}
		if ex.answer == "" {
			t.Fatalf("request %d: the sim answered no text", i)
		}
		if n == 2 {
			firsts++
			continue
		}
		// The previous turn: its messages are this one's but the last two,
		// and it came earlier; the assistant message is what it answered.
		prev := slices.IndexFunc(seen, func(p exchange) bool { return slices.Equal(p.messages, ex.messages[:n-2]) })
		switch {
		case prev < 0:
			t.Fatalf("request %d (turn %d): no earlier turn with its history %v", i, n/2, ex.messages[:n-2])
		case prev >= i:
			t.Errorf("request %d (turn %d) arrived before its previous turn (%d)", i, n/2, prev)
		case ex.messages[n-2] != (chatMessage{Role: "assistant", Content: seen[prev].answer}):
			t.Errorf("request %d: assistant message %q, but the sim answered %q", i, ex.messages[n-2].Content, seen[prev].answer)
		}
	}
	if firsts != sessions {
		t.Errorf("%d first turns, want %d", firsts, sessions)
	}
}

// With --compare-url both endpoints run the same sessions, each building its
// history on its own answers.
func TestRunSessionsCompare(t *testing.T) {
	var a, b recordingSim
	urlA, urlB := a.start(t, "sim-model"), b.start(t, "sim-model")
	_, err, m := runBench(t, context.Background(), "--url", urlA, "--compare-url", urlB, "--model", "sim-model", "--sessions", "4",
		"--turns", "2", "--shared-prefix", "20", "--input-len", "5", "--output-len", "4", "--rounds", "2", "--seed", "9", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results(t, m) {
		if r["completed"] != 8.0 || r["later_turns"] == nil {
			t.Errorf("endpoint %d: completed %v, later turns %v", i, r["completed"], r["later_turns"])
		}
	}
	users := func(rs *recordingSim) []string {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		var out []string
		for _, ex := range rs.seen {
			out = append(out, ex.messages[len(ex.messages)-1].Content)
		}
		slices.Sort(out)
		return out
	}
	if ua, ub := users(&a), users(&b); len(ua) != 8 || !slices.Equal(ua, ub) {
		t.Errorf("the endpoints got different user turns:\n%q\n%q", ua, ub)
	}
}
