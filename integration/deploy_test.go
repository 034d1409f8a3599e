package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// The deployment's NATS configuration, deploy/nats/nats.conf, run by a real
// nats-server with the tokenbus programs logged in as its deploy users.

// deployPasswords are the deploy users' passwords, the variables nats.conf
// reads (withPasswords defines them).
var deployPasswords = map[string]string{
	"NATS_SYS_PASSWORD": "sys-d", "NATS_GATEWAY_PASSWORD": "gw-d", "NATS_DISPATCHER_PASSWORD": "disp-d",
	"NATS_WORKER_PASSWORD": "worker-d", "NATS_OPERATOR_PASSWORD": "op-d", "NATS_TENANT_A_PASSWORD": "ta-d",
}

// withPasswords is conf with the variables its $NATS_..._PASSWORD
// references name defined at its top: nats-server looks a variable up in
// the file before the environment, so the file stays as deployed and the
// test's process environment is left alone (which t.Setenv would take, and
// with it the test's running beside others).
func withPasswords(conf []byte, passwords map[string]string) []byte {
	var b bytes.Buffer
	for k, v := range passwords {
		if bytes.Contains(conf, []byte("$"+k)) { // one not referenced would be an unknown field
			fmt.Fprintf(&b, "%s: %q\n", k, v)
		}
	}
	return append(b.Bytes(), conf...)
}

// natsLog is a nats-server's log, kept to look for permission violations
// (the server logs each one, whoever made it).
type natsLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *natsLog) add(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
}

func (l *natsLog) Noticef(format string, v ...any) { l.add("[INF]", format, v...) }
func (l *natsLog) Warnf(format string, v ...any)   { l.add("[WRN]", format, v...) }
func (l *natsLog) Fatalf(format string, v ...any)  { l.add("[FTL]", format, v...) }
func (l *natsLog) Errorf(format string, v ...any)  { l.add("[ERR]", format, v...) }
func (l *natsLog) Debugf(format string, v ...any)  { l.add("[DBG]", format, v...) }
func (l *natsLog) Tracef(format string, v ...any)  { l.add("[TRC]", format, v...) }

// matching is every line containing one of subs, case ignored.
func (l *natsLog) matching(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return grep(l.lines, subs...)
}

func grep(lines []string, subs ...string) []string {
	var out []string
	for _, line := range lines {
		low := strings.ToLower(line)
		for _, s := range subs {
			if strings.Contains(low, strings.ToLower(s)) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// deployNATS starts a nats-server from deploy/nats/nats.conf, its tenant
// block replaced by users when users is not nil, with JetStream in a
// temporary directory, on a port chosen now, the deploy users' passwords
// deployPasswords.
func deployNATS(t *testing.T, users []byte) (url string, log *natsLog) {
	t.Helper()
	conf, err := os.ReadFile("../deploy/nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	if users != nil {
		block := regexp.MustCompile(`(?s)      # BEGIN tokenbus nats-users [^\n]*\n(.*?)      # END tokenbus nats-users`)
		if !block.Match(conf) {
			t.Fatal("nats.conf has no generated tenant block")
		}
		conf = block.ReplaceAllLiteral(conf, users)
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, withPasswords(conf, deployPasswords), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", -1, 0, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	log = &natsLog{}
	ns.SetLoggerV2(log, false, false, false)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return ns.ClientURL(), log
}

// componentLog is one program's log, warnings and up, kept and shown.
type componentLog struct {
	buf syncBuffer
	t   *testing.T
}

func (c *componentLog) Write(p []byte) (int, error) {
	c.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return c.buf.Write(p)
}

func (c *componentLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// deployStack is a gateway (no embedded dispatcher), a dispatcher and a sim
// worker, each logged in as its deploy user.
type deployStack struct {
	base, admin string
	metrics     busMetrics
	logs        map[string]*componentLog
}

// busMetrics are the base URLs of the dispatcher's and worker's /metrics.
type busMetrics struct{ dispatcher, worker string }

const deployAdminToken = "deploy-admin-token"

func startDeployStack(t *testing.T, url, redisURL string) *deployStack {
	t.Helper()
	ctx := context.Background()
	s := &deployStack{logs: map[string]*componentLog{}}
	logFor := func(name string) *slog.Logger {
		l := &componentLog{t: t}
		s.logs[name] = l
		return l.logger()
	}
	s.metrics = startDispatcherWorker(t, url, redisURL, logFor)
	gcfg := program.DefaultGateway()
	gcfg.NATS, gcfg.Redis.URL, gcfg.Log = deployLogin(url, "gateway"), redisURL, logFor("gateway")
	gcfg.EmbedDispatcher = false
	gcfg.HTTP.Listen, gcfg.HTTP.Admin, gcfg.HTTP.AdminToken = "127.0.0.1:0", "127.0.0.1:0", deployAdminToken
	gw, err := program.StartGateway(ctx, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	s.base, s.admin = "http://"+gw.Addr(), "http://"+gw.AdminAddr()
	waitReady(t, s.base)
	return s
}

// deployLogin is the NATS login of deploy user user, its password
// deployPasswords's, as deployNATS gives it to the server.
func deployLogin(url, user string) natsconn.Options {
	return natsconn.Options{URL: url, User: user, Password: deployPasswords["NATS_"+strings.ToUpper(user)+"_PASSWORD"]}
}

// startDispatcherWorker starts a dispatcher and a sim worker (id w1, model
// llama-8b) logged in as their deploy users, logging to logFor(name).
func startDispatcherWorker(t *testing.T, url, redisURL string, logFor func(string) *slog.Logger) busMetrics {
	t.Helper()
	ctx := context.Background()
	dcfg := program.DefaultDispatcher()
	dcfg.NATS, dcfg.Redis.URL, dcfg.Log = deployLogin(url, "dispatcher"), redisURL, logFor("dispatcher")
	dcfg.Metrics = "127.0.0.1:0"
	disp, err := program.StartDispatcher(ctx, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = disp.Close() })
	wcfg := program.DefaultWorker()
	wcfg.NATS, wcfg.Redis.URL, wcfg.Log = deployLogin(url, "worker"), redisURL, logFor("worker")
	wcfg.Worker.ID, wcfg.Metrics = "w1", "127.0.0.1:0"
	wcfg.Engine.Model = "llama-8b"
	// Slow enough that a background response can be cancelled in flight.
	wcfg.Engine.Sim.DecodeBase, wcfg.Engine.Sim.PrefillBase = 10*time.Millisecond, time.Millisecond
	// Answers run to their max tokens: the background response cancelled
	// below must still be running when the cancel comes (a natural stop
	// after a few dozen tokens lost that race on a busy machine).
	wcfg.Engine.Sim.MinEOS, wcfg.Engine.Sim.MaxEOS = 5000, 5000
	wk, err := program.StartWorker(ctx, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })
	return busMetrics{dispatcher: "http://" + disp.Addr(), worker: "http://" + wk.Addr()}
}

// TestDeployConfigEveryFeature runs every feature of tokenbus through a
// real nats-server started from deploy/nats/nats.conf, with a gateway, a
// dispatcher and a worker logged in as its deploy users, and finds no
// permission violation anywhere: not in the server's log, not in any
// program's (nats.go reports a refused publish or subscription as an
// asynchronous error, which every program logs), and no feature turned off.
func TestDeployConfigEveryFeature(t *testing.T) {
	t.Parallel()
	url, serverLog := deployNATS(t, nil)
	rd, store := startStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key, secret, err := store.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	s := startDeployStack(t, url, rd.URL)
	auth := []string{"Authorization", "Bearer " + secret}
	oc := openai.NewClient(option.WithBaseURL(s.base+"/v1"), option.WithAPIKey(secret), option.WithMaxRetries(0),
		option.WithRequestTimeout(time.Minute))
	requests := 0 // answered requests, each a usage record
	// Usage: every answered request is recorded against the key (the
	// gateway's and the worker's records through TOKENBUS_USAGE into
	// Redis), checked after each feature.
	recorded := func() (int64, error) {
		var u struct {
			Data []struct {
				Requests int64 `json:"requests"`
			} `json:"data"`
		}
		if st, b, err := httpJSON("GET", s.admin+"/usage?key_id="+key.ID, "", nil, &u, "Authorization", "Bearer "+deployAdminToken); st != 200 || err != nil {
			return 0, fmt.Errorf("usage: %d %v %s", st, err, b)
		}
		var n int64
		for _, d := range u.Data {
			n += d.Requests
		}
		return n, nil
	}
	usageRecorded := func(t *testing.T) {
		t.Helper()
		testenv.WaitFor(t, 15*time.Second, func() error {
			n, err := recorded()
			if err == nil && n < int64(requests) {
				err = fmt.Errorf("%d requests recorded, want %d", n, requests)
			}
			return err
		})
	}

	t.Run("chat", func(t *testing.T) {
		c, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		if err != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content == "" {
			t.Fatalf("chat: %v %+v", err, c)
		}
		requests++
		st := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		var text strings.Builder
		for st.Next() {
			if ch := st.Current(); len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
			}
		}
		if err := st.Err(); err != nil || text.Len() == 0 {
			t.Fatalf("chat stream: %v, %q", err, text.String())
		}
		requests++
		usageRecorded(t)
	})

	t.Run("prefix-aware routing", func(t *testing.T) {
		// The worker publishes its prefix cache's events (kv.w1), the
		// dispatcher takes them in, and predicts the repeated prompt cached.
		system := strings.Repeat("You are a careful assistant who answers in plain words. ", 20)
		body := fmt.Sprintf(`{"model":"llama-8b","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, system)
		// Again until one is predicted (the events go out every 50 ms).
		testenv.WaitFor(t, 10*time.Second, func() error {
			if st, b, err := httpJSON("POST", s.base+"/v1/chat/completions", "application/json", strings.NewReader(body), nil, auth...); st != 200 || err != nil {
				t.Fatalf("chat: %d %v %s", st, err, b)
			}
			requests++
			kv := metricValue(t, s.metrics.dispatcher, "tokenbus_dispatcher_kv_events_total")
			if predicted, _, n := prefixCounts(t, s.metrics.worker); kv <= 0 || predicted <= 0 {
				return fmt.Errorf("dispatcher took %v KV event messages; %d requests compared, %v tokens predicted cached", kv, n, predicted)
			}
			return nil
		})
		usageRecorded(t)
	})

	t.Run("completions", func(t *testing.T) {
		c, err := oc.Completions.New(ctx, openai.CompletionNewParams{Model: "llama-8b", MaxTokens: openai.Int(4),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}})
		if err != nil || len(c.Choices) != 1 || c.Choices[0].Text == "" {
			t.Fatalf("completions: %v %+v", err, c)
		}
		requests++
		usageRecorded(t)
	})

	t.Run("embeddings", func(t *testing.T) {
		e, err := oc.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "llama-8b",
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")}})
		if err != nil || len(e.Data) != 1 || len(e.Data[0].Embedding) == 0 {
			t.Fatalf("embeddings: %v %+v", err, e)
		}
		requests++
		usageRecorded(t)
	})

	t.Run("files", func(t *testing.T) {
		content := []byte(`{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"llama-8b","messages":[{"role":"user","content":"hi"}]}}` + "\n")
		id := uploadFile(t, s.base, content, auth)
		var list struct{ Data []struct{ ID string } }
		if st, b, err := httpJSON("GET", s.base+"/v1/files", "", nil, &list, auth...); st != 200 || err != nil || len(list.Data) != 1 || list.Data[0].ID != id {
			t.Fatalf("list: %d %v %s", st, err, b)
		}
		var f struct {
			ID    string
			Bytes int
		}
		if st, b, err := httpJSON("GET", s.base+"/v1/files/"+id, "", nil, &f, auth...); st != 200 || err != nil || f.Bytes != len(content) {
			t.Fatalf("get: %d %v %s", st, err, b)
		}
		if st, b, err := httpJSON("GET", s.base+"/v1/files/"+id+"/content", "", nil, nil, auth...); st != 200 || err != nil || !bytes.Equal(b, content) {
			t.Fatalf("content: %d %v %q", st, err, b)
		}
		var del struct{ Deleted bool }
		if st, b, err := httpJSON("DELETE", s.base+"/v1/files/"+id, "", nil, &del, auth...); st != 200 || err != nil || !del.Deleted {
			t.Fatalf("delete: %d %v %s", st, err, b)
		}
		if st, _, _ := httpJSON("GET", s.base+"/v1/files/"+id, "", nil, nil, auth...); st != 404 {
			t.Fatalf("get after delete: %d", st)
		}
	})

	t.Run("batch", func(t *testing.T) {
		const n = 5
		var lines bytes.Buffer
		for i := range n {
			fmt.Fprintf(&lines, `{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":{"model":"llama-8b","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}}`+"\n", i)
		}
		in := uploadFile(t, s.base, lines.Bytes(), auth)
		var b batchState
		if st, body, err := httpJSON("POST", s.base+"/v1/batches", "application/json", strings.NewReader(
			`{"input_file_id":"`+in+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`), &b, auth...); st != 200 || err != nil {
			t.Fatalf("create: %d %v %s", st, err, body)
		}
		testenv.WaitFor(t, time.Minute, func() error {
			if st, body, err := httpJSON("GET", s.base+"/v1/batches/"+b.ID, "", nil, &b, auth...); st != 200 || err != nil {
				return fmt.Errorf("get: %d %v %s", st, err, body)
			}
			if b.Status != "completed" {
				return fmt.Errorf("status %s, counts %+v", b.Status, b.RequestCounts)
			}
			return nil
		})
		if b.RequestCounts.Completed != n || b.OutputFileID == nil {
			t.Fatalf("batch %+v", b)
		}
		st, out, err := httpJSON("GET", s.base+"/v1/files/"+*b.OutputFileID+"/content", "", nil, nil, auth...)
		if st != 200 || err != nil || bytes.Count(out, []byte("\n")) != n || !bytes.Contains(out, []byte(`"status_code":200`)) {
			t.Fatalf("output: %d %v %s", st, err, out)
		}
		var list struct{ Data []struct{ ID string } }
		if st, body, err := httpJSON("GET", s.base+"/v1/batches", "", nil, &list, auth...); st != 200 || err != nil || len(list.Data) != 1 {
			t.Fatalf("list: %d %v %s", st, err, body)
		}
		requests += n
		usageRecorded(t)
	})

	t.Run("stored response and previous_response_id", func(t *testing.T) {
		var r1, r2 struct{ ID, Status string }
		if st, b, err := httpJSON("POST", s.base+"/v1/responses", "application/json", strings.NewReader(
			`{"model":"llama-8b","input":"hi","max_output_tokens":4}`), &r1, auth...); st != 200 || err != nil || !responseEnded(r1.Status) {
			t.Fatalf("create: %d %v %s", st, err, b)
		}
		if st, b, err := httpJSON("GET", s.base+"/v1/responses/"+r1.ID, "", nil, &r2, auth...); st != 200 || err != nil || r2.ID != r1.ID {
			t.Fatalf("retrieve: %d %v %s", st, err, b)
		}
		var r3 struct {
			ID                 string
			Status             string
			PreviousResponseID string `json:"previous_response_id"`
		}
		if st, b, err := httpJSON("POST", s.base+"/v1/responses", "application/json", strings.NewReader(
			`{"model":"llama-8b","input":"and then?","max_output_tokens":4,"previous_response_id":"`+r1.ID+`"}`), &r3, auth...); st != 200 || err != nil ||
			!responseEnded(r3.Status) || r3.PreviousResponseID != r1.ID {
			t.Fatalf("previous_response_id: %d %v %s", st, err, b)
		}
		var items struct{ Data []json.RawMessage }
		if st, b, err := httpJSON("GET", s.base+"/v1/responses/"+r3.ID+"/input_items", "", nil, &items, auth...); st != 200 || err != nil || len(items.Data) == 0 {
			t.Fatalf("input_items: %d %v %s", st, err, b)
		}
		if st, b, err := httpJSON("DELETE", s.base+"/v1/responses/"+r1.ID, "", nil, nil, auth...); st != 200 || err != nil {
			t.Fatalf("delete: %d %v %s", st, err, b)
		}
		if st, _, _ := httpJSON("GET", s.base+"/v1/responses/"+r1.ID, "", nil, nil, auth...); st != 404 {
			t.Fatalf("retrieve after delete: %d", st)
		}
		requests += 2
		usageRecorded(t)
	})

	t.Run("background response followed and cancelled", func(t *testing.T) {
		var r struct{ ID, Status string }
		if st, b, err := httpJSON("POST", s.base+"/v1/responses", "application/json", strings.NewReader(
			`{"model":"llama-8b","input":"a long one","max_output_tokens":2000,"background":true}`), &r, auth...); st != 200 || err != nil || r.Status != "queued" {
			t.Fatalf("create: %d %v %s", st, err, b)
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", s.base+"/v1/responses/"+r.ID+"?stream=true", nil)
		req.Header.Set(auth[0], auth[1])
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("follow: %v %v", err, res)
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		deltas, cancelled, last := 0, false, ""
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev struct{ Type string }
			_ = json.Unmarshal([]byte(data), &ev)
			last = ev.Type
			if ev.Type == "response.output_text.delta" {
				if deltas++; deltas == 3 && !cancelled {
					var c struct{ Status string }
					if st, b, err := httpJSON("POST", s.base+"/v1/responses/"+r.ID+"/cancel", "", nil, &c, auth...); st != 200 || err != nil || c.Status != "cancelled" {
						t.Fatalf("cancel: %d %v %s", st, err, b)
					}
					cancelled = true
				}
			}
			if ev.Type == "response.cancelled" || ev.Type == "response.completed" || ev.Type == "response.failed" || ev.Type == "response.incomplete" {
				break
			}
		}
		if !cancelled || last != "response.cancelled" {
			t.Fatalf("followed %d deltas, cancel sent %v, last event %q", deltas, cancelled, last)
		}
		var got struct{ Status string }
		if st, b, err := httpJSON("GET", s.base+"/v1/responses/"+r.ID, "", nil, &got, auth...); st != 200 || err != nil || got.Status != "cancelled" {
			t.Fatalf("retrieve: %d %v %s", st, err, b)
		}
		// Not counted: a cancelled background response records no usage
		// today (the runner stops at the cancel; the responses runner's
		// business, not this configuration's).
	})

	t.Run("resumable chat stream resumed with Last-Event-ID", func(t *testing.T) {
		const body = `{"model":"llama-8b","max_tokens":30,"ignore_eos":true,"stream":true,"messages":[{"role":"user","content":"x"}]}`
		var ids []string
		read := func(lastID string, stopAt int) (done bool) {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(auth[0], auth[1])
			req.Header.Set("Tokenbus-Resumable", "true")
			if lastID != "" {
				req.Header.Set("Last-Event-ID", lastID)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil || res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Tokenbus-Stream-Id"), "cs_") {
				t.Fatalf("POST: %v %v", err, res)
			}
			defer res.Body.Close()
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
					ids = append(ids, id)
				}
				if sc.Text() == "data: [DONE]" {
					return true
				}
				if stopAt > 0 && len(ids) >= stopAt {
					return false
				}
			}
			return false
		}
		if read("", 5) {
			t.Fatal("ended before the client left")
		}
		if !read(ids[len(ids)-1], 0) {
			t.Fatal("no [DONE] after the resume")
		}
		stream, _, _ := strings.Cut(ids[0], ":")
		for i, id := range ids {
			if want := fmt.Sprintf("%s:%d", stream, i+1); id != want {
				t.Fatalf("event %d has id %s, want %s", i, id, want)
			}
		}
		requests++
		usageRecorded(t)
	})

	// Nothing refused, nothing turned off, anywhere.
	if v := serverLog.matching("violation"); len(v) > 0 {
		t.Errorf("nats-server logged %d permission violations:\n%s", len(v), strings.Join(v, "\n"))
	}
	for name, l := range s.logs {
		if v := grep(l.buf.lines(), "violation", "permission", " are off", "is off"); len(v) > 0 {
			t.Errorf("%s logged:\n%s", name, strings.Join(v, "\n"))
		}
	}
}

// ended: a response the sim finished (at its end of sequence or at
// max_output_tokens).
func responseEnded(status string) bool { return status == "completed" || status == "incomplete" }

// uploadFile uploads content as a batch input file; its id.
func uploadFile(t *testing.T, base string, content []byte, hdr []string) string {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(content)
	_ = mw.Close()
	var f struct{ ID string }
	if st, body, err := httpJSON("POST", base+"/v1/files", mw.FormDataContentType(), io.Reader(&buf), &f, hdr...); err != nil || st != 200 {
		t.Fatalf("upload: %d %s %v", st, body, err)
	}
	return f.ID
}

// TestDeployFeatureOffSaysWhy: a gateway whose NATS user lacks the
// JetStream permissions of a feature serves without it, and says so at
// error level, naming the feature and the permission the server refused
// (rather than "JetStream is unavailable", which sends operators to
// $JS.API.>).
func TestDeployFeatureOffSaysWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: each refused store takes its 5 s opening timeout")
	}
	t.Parallel() // the two 5 s timeouts waited beside other tests
	conf, err := os.ReadFile("../deploy/nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's grants for the responses bucket and the files object
	// store name other streams: what a configuration that predates a
	// feature looks like to it.
	broken := strings.NewReplacer("KV_TOKENBUS_RESPONSES", "KV_TOKENBUS_RESPONSES_OLD",
		"OBJ_TOKENBUS_FILES", "OBJ_TOKENBUS_FILES_OLD").Replace(string(conf))
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, withPasswords([]byte(broken), deployPasswords), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", -1, 0, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	l := &componentLog{t: t}
	gcfg := program.DefaultGateway()
	gcfg.NATS = natsconn.Options{URL: ns.ClientURL(), User: "gateway", Password: deployPasswords["NATS_GATEWAY_PASSWORD"]}
	gcfg.Redis.URL, gcfg.HTTP.Auth, gcfg.HTTP.Admin, gcfg.HTTP.Listen = "", false, "", "127.0.0.1:0"
	gcfg.Log = l.logger()
	gw, err := program.StartGateway(context.Background(), gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	for feature, stream := range map[string]string{
		"stored and background responses": "KV_TOKENBUS_RESPONSES",
		"files and batches":               "OBJ_TOKENBUS_FILES",
	} {
		var found bool
		for _, line := range l.buf.lines() {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, feature+" are OFF") &&
				strings.Contains(line, `missing_permission="publish to $JS.API.STREAM.UPDATE.`+stream+`"`) {
				found = true
			}
		}
		if !found {
			t.Errorf("no error naming %s and the refused $JS.API.STREAM.UPDATE.%s:\n%s", feature, stream, strings.Join(l.buf.lines(), "\n"))
		}
	}
	// And the feature is off, the rest served.
	base := "http://" + gw.Addr()
	if st, b, _ := httpJSON("POST", base+"/v1/responses", "application/json", strings.NewReader(`{"model":"llama-8b","input":"x","background":true}`), nil); st != 503 {
		t.Errorf("a background response: %d %s, want 503", st, b)
	}
}
