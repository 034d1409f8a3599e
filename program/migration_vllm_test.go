package program

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// httpFleet is a dispatcher, two workers (w1, w2) with an HTTP engine of
// kind ("vllm" or "openai"), each in front of its own fake vLLM, and a
// gateway routing through that dispatcher.
func httpFleet(t *testing.T, ns *server.Server, kind string) ([]*Worker, []*fakevllm.Server, *Gateway) {
	return httpFleetOn(t, ns, kind, "")
}

// httpFleetOn is httpFleet with the dispatcher's registry on redisURL
// ("": none).
func httpFleetOn(t *testing.T, ns *server.Server, kind, redisURL string) ([]*Worker, []*fakevllm.Server, *Gateway) {
	t.Helper()
	ctx := context.Background()
	dc := DefaultDispatcher()
	dc.NATS.URL, dc.Redis.URL = ns.ClientURL(), redisURL
	disp, err := StartDispatcher(ctx, dc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = disp.Close() })
	var (
		ws    []*Worker
		fakes []*fakevllm.Server
	)
	for i := 1; i <= 2; i++ {
		fake := fakevllm.New()
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		wc := DefaultWorker()
		wc.NATS.URL, wc.Worker.ID = ns.ClientURL(), fmt.Sprintf("w%d", i)
		wc.Engine.Kind, wc.Engine.URL, wc.Engine.StartTimeout = kind, srv.URL, 10*time.Second
		w, err := StartWorker(ctx, wc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		ws, fakes = append(ws, w), append(fakes, fake)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := disp.run().d.Fleet().Len(); n != 2 {
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
	return ws, fakes, gw
}

// sseLines posts body to the gateway's endpoint with request id id and
// sends each data line of the answer on out, closing it at the end.
func sseLines(ctx context.Context, t *testing.T, gw *Gateway, path, id, body string, out chan<- string) {
	defer close(out)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.Addr()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("%s: status %d: %s", path, resp.StatusCode, b)
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out <- d
		}
	}
}

// collect runs a request to its end and returns its data lines.
func collect(ctx context.Context, t *testing.T, gw *Gateway, path, id, body string) []string {
	ch := make(chan string, 256)
	go sseLines(ctx, t, gw, path, id, body, ch)
	var lines []string
	for l := range ch {
		lines = append(lines, l)
	}
	return lines
}

// A stream whose vLLM worker dies (killed: its NATS connection closed, no
// goodbye) or whose engine cuts it (the body ends before any
// finish_reason) mid-stream is continued on the other worker from the
// token ids of its prompt and of what it had streamed, on the completions
// endpoint, and the client's stream is byte for byte that of one
// uninterrupted run: every data line (chat chunks for a chat stream, the
// engine's keys in the engine's order), the usage, [DONE]; 0 tokens lost or
// repeated, and no token id the client did not ask for. The fake vLLM
// continues a token-id prompt where its ids left off and restarts a text
// one (internal/fakevllm/tokens.go), as a model's next token follows from
// the ids before it: a text continuation (main's) repeats " tok0...".
func TestExactMigrationVLLM(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	for _, tc := range []struct {
		name, path, body string
		fault            string // "kill" or "cut"
		script           string // x_fake of both runs
		max              int    // tokens of the stream
	}{
		{"chat/kill", "/v1/chat/completions", `{"model":"base","stream":true,"max_tokens":24,"seed":5,"temperature":0.7,"ignore_eos":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me a story"}]%s}`, "kill", "", 24},
		{"chat/cut", "/v1/chat/completions", `{"model":"base","stream":true,"max_completion_tokens":24,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me a story"}]%s}`, "cut", "", 24},
		{"chat/no limit", "/v1/chat/completions", `{"model":"base","stream":true,"messages":[{"role":"user","content":"Tell me a story"}]%s}`, "cut", `"stop_at":19,"chunks":100000`, 20},
		{"completions/kill", "/v1/completions", `{"model":"base","stream":true,"max_tokens":24,"seed":5,"prompt":"Once upon a time"%s}`, "kill", "", 24},
		{"completions/cut", "/v1/completions", `{"model":"base","stream":true,"max_tokens":24,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"prompt":"Once upon a time"%s}`, "cut", "", 24},
		{"chat/asked for ids", "/v1/chat/completions", `{"model":"base","stream":true,"max_tokens":24,"return_token_ids":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]%s}`, "cut", "", 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, fakes, gw := httpFleet(t, testenv.NATS(t), "vllm")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			script := func(fault string) string {
				parts := slices.DeleteFunc([]string{tc.script, fault}, func(s string) bool { return s == "" })
				if len(parts) == 0 {
					return ""
				}
				return `,"x_fake":{` + strings.Join(parts, ",") + `}`
			}
			const refID, id = "ref", "mig"
			ref := collect(ctx, t, gw, tc.path, refID, fmt.Sprintf(tc.body, script("")))

			fault := `"delay_ms":40`
			if tc.fault == "cut" {
				fault = fmt.Sprintf(`"cut_after":%d`, tc.max/2)
			}
			ch := make(chan string, 256)
			go sseLines(ctx, t, gw, tc.path, id, fmt.Sprintf(tc.body, script(fault)), ch)
			var got []string
			for l := range ch {
				got = append(got, l)
				if tc.fault == "kill" && len(got) == 8 {
					victim := ws[0]
					if fakes[0].Body(id) == nil {
						victim = ws[1]
					}
					victim.run().nc.Close()
				}
			}

			norm := func(ls []string, id string) []string {
				out := make([]string, len(ls))
				for i, l := range ls {
					out[i] = strings.ReplaceAll(l, `-`+id+`"`, `-ID"`)
				}
				return out
			}
			if r, g := norm(ref, refID), norm(got, id); !slices.Equal(r, g) {
				t.Fatalf("the migrated stream differs from one uninterrupted run:\ngot  %s\nwant %s", strings.Join(g, "\n     "), strings.Join(r, "\n     "))
			}
			if !strings.Contains(tc.body, "return_token_ids") {
				for _, l := range got {
					if strings.Contains(l, `token_ids":[`) {
						t.Fatalf("a token id the client did not ask for: %s", l)
					}
				}
			}
			checkContinuation(t, fakes, id, tc.path, tc.body, tc.max)
		})
	}
}

// checkContinuation: request id went first to tc.path on one fake and was
// continued on the other's completions endpoint from the ids of its prompt
// and of the k tokens streamed (ids FirstTokenID...+k-1), for the tokens
// left (max less k; without a limit, the context left), with the first
// request's sampling parameters.
func checkContinuation(t *testing.T, fakes []*fakevllm.Server, id, path, body string, max int) {
	t.Helper()
	var first, second *fakevllm.Server
	for _, f := range fakes {
		for _, r := range f.Received() {
			switch {
			case r.ID != id:
			case r.Path == "/v1/completions" && strings.Contains(string(r.Body), `"prompt":[`):
				second = f
			case r.Path == path:
				first = f
			}
		}
	}
	if first == nil || second == nil || first == second {
		t.Fatalf("no continuation on the other worker")
	}
	var head struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		Choices        []struct {
			PromptTokenIDs []int `json:"prompt_token_ids"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(first.Sent(id)[0]), &head); err != nil {
		t.Fatal(err)
	}
	prompt := head.PromptTokenIDs
	if prompt == nil {
		prompt = head.Choices[0].PromptTokenIDs
	}
	var cont struct {
		Prompt         []int    `json:"prompt"`
		MaxTokens      *int     `json:"max_tokens"`
		ReturnTokenIDs bool     `json:"return_token_ids"`
		Seed           *int     `json:"seed"`
		Temperature    *float64 `json:"temperature"`
		Messages       any      `json:"messages"`
	}
	reqs := second.Received()
	cb := reqs[len(reqs)-1].Body
	if err := json.Unmarshal(cb, &cont); err != nil {
		t.Fatal(err)
	}
	k := len(cont.Prompt) - len(prompt)
	wantMax := max - k
	if !strings.Contains(body, "max_") {
		wantMax = 8192 - len(cont.Prompt) // the fake's max_model_len less the prompt
	}
	ok := len(prompt) == 7 && k > 0 && slices.Equal(cont.Prompt[:len(prompt)], prompt) && cont.MaxTokens != nil &&
		*cont.MaxTokens == wantMax && cont.ReturnTokenIDs && cont.Messages == nil &&
		strings.Contains(body, `"seed":5`) == (cont.Seed != nil && *cont.Seed == 5) &&
		strings.Contains(body, `"temperature":0.7`) == (cont.Temperature != nil && *cont.Temperature == 0.7)
	for i, id := range cont.Prompt[len(prompt):] {
		ok = ok && id == fakevllm.FirstTokenID+i
	}
	if !ok {
		t.Fatalf("continuation %s\nwant the prompt %v and %d token ids from %d, max_tokens %d", cb, prompt, k, fakevllm.FirstTokenID, wantMax)
	}
	t.Logf("%d of %d tokens streamed before the fault, the rest from their ids", k, max)
}

// An engine without token ids (the openai engine: OpenAI's API has no
// return_token_ids, and it is never asked) keeps the text continuation: the
// chat stream's messages with the partial assistant message, vLLM's
// continue_final_message, on the chat endpoint; the client's stream has its
// tokens, not one run's (the fake starts again from a text prompt).
func TestTextMigrationOpenAI(t *testing.T) {
	_, fakes, gw := httpFleet(t, testenv.NATS(t), "openai")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := collect(ctx, t, gw, "/v1/chat/completions", "txt",
		`{"model":"base","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"x_fake":{"cut_after":6}}`)
	var text strings.Builder
	for _, l := range got {
		var ch struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(l), &ch) == nil && len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if want := " tok0 tok1 tok2 tok3 tok4 tok5 tok0 tok1 tok2 tok3"; text.String() != want {
		t.Fatalf("text %q, want %q", text.String(), want)
	}
	var cont []byte
	for _, f := range fakes {
		for _, r := range f.Received() {
			if r.Path == "/v1/chat/completions" && strings.Contains(string(r.Body), "continue_final_message") {
				cont = r.Body
			}
			if strings.Contains(string(r.Body), "return_token_ids") {
				t.Fatalf("the openai engine asked for token ids: %s", r.Body)
			}
		}
	}
	var body struct {
		Messages  []struct{ Role, Content string } `json:"messages"`
		MaxTokens int                              `json:"max_tokens"`
	}
	if err := json.Unmarshal(cont, &body); err != nil || len(body.Messages) != 2 || body.Messages[1].Content != " tok0 tok1 tok2 tok3 tok4 tok5" || body.MaxTokens != 4 {
		t.Fatalf("continuation %s", cont)
	}
}

// A NATS-native tenant's stream that migrates is one request: its
// continuation, sent again on the tenant's subject with Tb-Exclude and
// Tb-Resume, is let in on the first admission (real Redis), so the key's
// window counts 1 request, and the first reservation is the only one.
func TestMigratedTenantRequestCountsOnce(t *testing.T) {
	t.Parallel() // its own servers on its own ports
	ns := testenv.NATS(t)
	rd := testenv.StartRedis(t)
	httpFleetOn(t, ns, "vllm", rd.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := registry.Open(ctx, rd.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	key, _, err := store.CreateKey(ctx, registry.KeySpec{Tenant: "acme", RPM: 50, TPM: 100000})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.CustomInboxPrefix(schemas.TenantInbox("acme")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var migrations atomic.Int32
	cl, err := client.New(nc, client.Options{KeyID: key.ID, OnFailover: func(ev client.Failover) {
		if ev.Kind == client.FailoverMigration {
			migrations.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(strings.TrimSuffix(rd.URL, "/0"), "redis://")})
	defer rdb.Close()
	counted := func() (requests, tokens int) {
		v, err := rdb.HMGet(ctx, "tokenbus:key:{"+key.ID+"}:rl", "r", "t").Result()
		if err != nil {
			t.Fatal(err)
		}
		r, _ := strconv.Atoi(fmt.Sprint(v[0]))
		tk, _ := strconv.Atoi(fmt.Sprint(v[1]))
		return r, tk
	}
	for i, body := range []string{
		`{"model":"base","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"hi"}],"x_fake":{"cut_after":12}}`,
		`{"model":"base","stream":true,"max_tokens":20,"prompt":"once","x_fake":{"cut_after":12}}`,
	} {
		kind := schemas.KindChat
		if i == 1 {
			kind = schemas.KindCompletion
		}
		r0, t0 := counted()
		st, err := cl.Start(&client.Request{ID: fmt.Sprintf("tenant-%d", i), Kind: kind, Model: "base", Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		for {
			f, err := st.Next(ctx)
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			if f.Type == schemas.FrameDone {
				break
			}
		}
		st.Close()
		r1, t1 := counted()
		if migrations.Load() != int32(i+1) || r1-r0 != 1 {
			t.Fatalf("%s: %d migrations; the key's window counted %d requests for one, want 1", kind, migrations.Load(), r1-r0)
		}
		reserved := t1 - t0
		// One reservation: the body's estimate and its max_tokens; a second
		// one would hold as much again until the window ends.
		if want := (len(body)+registry.PromptBytesPerToken-1)/registry.PromptBytesPerToken + 20; reserved != want {
			t.Fatalf("%s: %d tokens reserved, want one reservation of %d", kind, reserved, want)
		}
	}
	// Not a way around the limits: the first request sent again, after it
	// finished, with the headers of a resend naming a live worker that did
	// not fail it, is a new request (counted again).
	r0, _ := counted()
	m := nats.NewMsg(schemas.TenantReqSubject(key.ID, "base"))
	m.Reply = schemas.TenantInbox("acme") + ".abuse.1"
	m.Header.Set(schemas.HdrRequestID, "tenant-0")
	m.Header.Set(schemas.HdrKind, string(schemas.KindChat))
	m.Header.Set(schemas.HdrExclude, "w1")
	m.Header.Set(schemas.HdrResume, "3")
	m.Data = []byte(`{"model":"base","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	sub, err := nc.SubscribeSync(m.Reply)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("the resend got no answer: %v", err)
	}
	if r1, _ := counted(); r1-r0 != 1 {
		t.Fatalf("a finished request sent again as a resend counted %d requests, want 1 (a new request)", r1-r0)
	}
}
