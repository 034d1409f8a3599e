package integration

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	tbusage "github.com/tokenbus/tokenbus/usage"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/program/natsusers"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// The threat model of docs/security.md, row by row, against a real
// nats-server running deploy/nats/nats.conf with its tenant block generated
// (natsusers, as `tokenbus nats-users` does) for two tenants' real API keys,
// a real standalone dispatcher and a real worker (sim engine) logged in as
// their deploy users, and the tenants as NATS-native clients.

var threatPasswords = map[string]string{
	"NATS_SYS_PASSWORD": "sys-s", "NATS_GATEWAY_PASSWORD": "gw-s", "NATS_DISPATCHER_PASSWORD": "disp-s",
	"NATS_WORKER_PASSWORD": "worker-s", "NATS_OPERATOR_PASSWORD": "op-s", "NATS_TENANT_A_PASSWORD": "ta-s",
}

// tconn is a connection that records permission violations.
type tconn struct {
	*nats.Conn
	mu   sync.Mutex
	errs []string
}

func (c *tconn) violated(op, subject string) func() error {
	want := strings.ToLower(fmt.Sprintf("permissions violation for %s to %q", op, subject))
	return func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, e := range c.errs {
			if strings.Contains(strings.ToLower(e), want) {
				return nil
			}
		}
		return fmt.Errorf("no %q (errors %q)", want, c.errs)
	}
}

func tconnect(t *testing.T, url string, opts ...nats.Option) *tconn {
	t.Helper()
	c := &tconn{}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		c.mu.Lock()
		c.errs = append(c.errs, err.Error())
		c.mu.Unlock()
	}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c
}

// tstream is one request's reply stream as a tenant reads it.
type tstream struct {
	mu     sync.Mutex
	frames []schemas.Frame
}

func (s *tstream) all() []schemas.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]schemas.Frame(nil), s.frames...)
}

func (s *tstream) last() schemas.Frame {
	f := s.all()
	if len(f) == 0 {
		return schemas.Frame{}
	}
	return f[len(f)-1]
}

func (s *tstream) accepted() (schemas.Accepted, bool) {
	for _, f := range s.all() {
		if f.Type == schemas.FrameAccepted {
			return schemas.ParseAccepted(f.Payload)
		}
	}
	return schemas.Accepted{}, false
}

// tenantRequest publishes a chat request on subject with reply under inbox
// (its stream is read only when the connection may read there).
func tenantRequest(t *testing.T, c *tconn, subject, inbox, id string, maxTokens int, hdr nats.Header) *tstream {
	t.Helper()
	s := &tstream{}
	reply := inbox + "." + id
	if sub, err := c.Subscribe(reply, func(m *nats.Msg) {
		f, err := schemas.ParseFrame(m.Data)
		if err != nil {
			return
		}
		f.Payload = bytes.Clone(f.Payload)
		s.mu.Lock()
		s.frames = append(s.frames, f)
		s.mu.Unlock()
	}); err == nil {
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	_ = c.Flush()
	h := nats.Header{}
	for k, v := range hdr {
		h[k] = v
	}
	h.Set(schemas.HdrRequestID, id)
	h.Set(schemas.HdrKind, "chat")
	body := fmt.Sprintf(`{"model":"llama-8b","stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
	if err := c.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Header: h, Data: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	return s
}

func endsWith(s *tstream, typ schemas.FrameType, code string) func() error {
	return func() error {
		f := s.last()
		if f.Type != typ {
			return fmt.Errorf("last frame %q (%d frames)", f.Type, len(s.all()))
		}
		if code != "" {
			if e := schemas.ParseErrorPayload(f.Payload); e.Body.Code == nil || *e.Body.Code != code {
				return fmt.Errorf("error %s, want %s", f.Payload, code)
			}
		}
		return nil
	}
}

func TestThreatModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rd, store := startStore(t)
	keyA, _, err := store.CreateKey(ctx, registry.KeySpec{Tenant: "tenant-a"})
	if err != nil {
		t.Fatal(err)
	}
	keyA1, _, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "tenant-a", RPM: 1}) // for the limit row
	keyB, _, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "tenant-b", Models: []string{"llama-8b"}})

	// deploy/nats/nats.conf with its tenant block generated for these keys.
	conf, err := os.ReadFile("../deploy/nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)      # BEGIN tokenbus nats-users [^\n]*\n(.*?)      # END tokenbus nats-users`)
	nkeyB := regexp.MustCompile(`nkey: (U[A-Z0-9]+)`).FindStringSubmatch(string(conf))
	if !block.Match(conf) || nkeyB == nil {
		t.Fatal("nats.conf has no generated tenant block")
	}
	keys, _ := store.ListKeys(ctx)
	var users bytes.Buffer
	if err := natsusers.Write(&users, natsusers.FromKeys(keys, map[string]string{"tenant-b": nkeyB[1]})); err != nil {
		t.Fatal(err)
	}
	conf = block.ReplaceAllLiteral(conf, users.Bytes())
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, withPasswords(conf, threatPasswords), 0o600); err != nil {
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
	url := ns.ClientURL()

	// The real dispatcher and worker, as their deploy users.
	dcfg := program.DefaultDispatcher()
	dcfg.NATS = natsconn.Options{URL: url, User: "dispatcher", Password: threatPasswords["NATS_DISPATCHER_PASSWORD"]}
	dcfg.Redis.URL = rd.URL
	disp, err := program.StartDispatcher(ctx, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = disp.Close() })
	wcfg := program.DefaultWorker()
	wcfg.NATS = natsconn.Options{URL: url, User: "worker", Password: threatPasswords["NATS_WORKER_PASSWORD"]}
	wcfg.Worker.ID = "w1"
	wcfg.Engine.Model = "llama-8b"
	wcfg.Engine.Sim.ServedNames = []string{"llama-8b-lora"}
	wk, err := program.StartWorker(ctx, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })
	// A gateway as its deploy user: it writes the usage log (JetStream
	// stream TOKENBUS_USAGE, where the worker's records go) into Redis.
	gcfg := program.DefaultGateway()
	gcfg.NATS = natsconn.Options{URL: url, User: "gateway", Password: threatPasswords["NATS_GATEWAY_PASSWORD"]}
	gcfg.Redis.URL = rd.URL
	gcfg.HTTP.Listen, gcfg.HTTP.Admin = "127.0.0.1:0", ""
	gw, err := program.StartGateway(ctx, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })

	// The operator watches what reaches the worker, its done notices and
	// the usage records.
	op := tconnect(t, url, nats.UserInfo("operator", threatPasswords["NATS_OPERATOR_PASSWORD"]))
	var omu sync.Mutex
	work := map[string]nats.Header{} // forwarded headers by request id
	doneIDs := map[string]bool{}
	var usage []schemas.UsageRecord
	op.Subscribe(schemas.WorkPrefix+"w1", func(m *nats.Msg) {
		omu.Lock()
		work[m.Header.Get(schemas.HdrRequestID)] = m.Header
		omu.Unlock()
	})
	op.Subscribe(schemas.DonePrefix+"*", func(m *nats.Msg) {
		if n, ok := schemas.ParseDoneNotice(m.Data); ok {
			omu.Lock()
			doneIDs[n.RequestID] = true
			omu.Unlock()
		}
	})
	op.Subscribe(schemas.UsagePrefix+">", func(m *nats.Msg) {
		recs, _ := tbusage.DecodeRecords(m.Data) // a message carries one record or more
		omu.Lock()
		usage = append(usage, recs...)
		omu.Unlock()
	})
	op.Flush()

	a := tconnect(t, url, nats.UserInfo("tenant-a", threatPasswords["NATS_TENANT_A_PASSWORD"]), nats.CustomInboxPrefix("_INBOX.tenant-a"))
	nkeyOpt, err := nats.NkeyOptionFromSeed("../deploy/nats/tenant-b.nk")
	if err != nil {
		t.Fatal(err)
	}
	b := tconnect(t, url, nkeyOpt, nats.CustomInboxPrefix("_INBOX.tenant-b"))
	inboxA, inboxB := schemas.TenantInbox("tenant-a")+".s", schemas.TenantInbox("tenant-b")+".s"
	subjA := schemas.TenantReqSubject(keyA.ID, "llama-8b")
	subjB := schemas.TenantReqSubject(keyB.ID, "llama-8b")
	// The worker joins the dispatcher's fleet: a request goes through.
	// (A dispatcher that has just started queues requests until it has heard
	// every worker's heartbeat.)
	warm := tenantRequest(t, a, subjA, inboxA, "warm", 2, nil)
	testenv.WaitFor(t, 10*time.Second, endsWith(warm, schemas.FrameDone, ""))

	t.Run("B cannot publish on A's request subjects, nor on req.>", func(t *testing.T) {
		for _, subj := range []string{subjA, schemas.TenantReqSubject(keyA.ID, "llama-8b-lora"), schemas.ReqSubject("llama-8b"),
			schemas.TenantReqSubject(keyB.ID, "llama-8b-lora")} {
			tenantRequest(t, b, subj, inboxB, "b-pub", 2, nil)
			testenv.WaitFor(t, 3*time.Second, b.violated("publish", subj))
		}
		omu.Lock()
		defer omu.Unlock()
		if work["b-pub"] != nil {
			t.Fatal("a refused publish reached the worker")
		}
	})

	t.Run("B cannot subscribe A's inbox", func(t *testing.T) {
		for _, subj := range []string{schemas.TenantInbox("tenant-a") + ".>", "_INBOX.>", schemas.UsagePrefix + ">"} {
			_, _ = b.SubscribeSync(subj)
			testenv.WaitFor(t, 3*time.Second, b.violated("subscription", subj))
		}
	})

	t.Run("B cannot aim replies at A's inbox: the dispatcher refuses", func(t *testing.T) {
		// NATS lets B publish with any reply subject; A listens there.
		spy := &tstream{}
		sub, _ := a.Subscribe(inboxA+".>", func(m *nats.Msg) {
			spy.mu.Lock()
			spy.frames = append(spy.frames, schemas.Frame{Payload: bytes.Clone(m.Data)})
			spy.mu.Unlock()
		})
		defer sub.Unsubscribe()
		a.Flush()
		tenantRequest(t, b, subjB, inboxA, "b-aimed", 2, nil)
		ok := tenantRequest(t, b, subjB, inboxB, "b-own", 2, nil) // after it, on one connection
		testenv.WaitFor(t, 5*time.Second, endsWith(ok, schemas.FrameDone, ""))
		omu.Lock()
		reached := work["b-aimed"] != nil
		omu.Unlock()
		if reached || len(spy.all()) != 0 {
			t.Fatalf("a request aimed at A's inbox was served (worker %v, %d frames in A's inbox)", reached, len(spy.all()))
		}
	})

	t.Run("B cannot cancel A's request without its token", func(t *testing.T) {
		s := tenantRequest(t, a, subjA, inboxA, "a-long", 150, nil)
		testenv.WaitFor(t, 5*time.Second, func() error {
			if _, ok := s.accepted(); !ok {
				return fmt.Errorf("not accepted")
			}
			return nil
		})
		acc, _ := s.accepted()
		for _, body := range [][]byte{[]byte("a-long"), schemas.CancelBody("a-long", ""), schemas.CancelBody("a-long", schemas.NewCancelToken())} {
			_ = b.Publish(acc.Cancel, body)
			_ = b.Publish(schemas.QueueCancel, body)
		}
		b.Flush()
		testenv.WaitFor(t, 10*time.Second, endsWith(s, schemas.FrameDone, ""))
		// Its owner can, with the token of its accepted frame.
		s2 := tenantRequest(t, a, subjA, inboxA, "a-cancel", 2000, nil)
		testenv.WaitFor(t, 5*time.Second, func() error {
			if _, ok := s2.accepted(); !ok {
				return fmt.Errorf("not accepted")
			}
			return nil
		})
		acc2, _ := s2.accepted()
		if len(acc2.CancelToken) != 2*schemas.CancelTokenBytes {
			t.Fatalf("accepted %+v: no cancel token", acc2)
		}
		_ = a.Publish(acc2.Cancel, schemas.CancelBody("a-cancel", acc2.CancelToken))
		testenv.WaitFor(t, 3*time.Second, func() error {
			omu.Lock()
			defer omu.Unlock()
			if !doneIDs["a-cancel"] {
				return fmt.Errorf("not ended at the worker")
			}
			return nil
		})
		if f := s2.last(); f.Type.Terminal() {
			t.Fatalf("a cancelled request ended with %s", f.Type)
		}
	})

	t.Run("Tb-Model cannot switch models", func(t *testing.T) {
		s := tenantRequest(t, a, subjA, inboxA, "a-switch", 2, nats.Header{schemas.HdrModel: {"llama-8b-lora"}})
		testenv.WaitFor(t, 5*time.Second, endsWith(s, schemas.FrameError, "model_mismatch"))
		omu.Lock()
		defer omu.Unlock()
		if work["a-switch"] != nil {
			t.Fatal("reached the worker")
		}
	})

	t.Run("Tb-Tenant, Tb-Key-Id, Tb-Adapter-* and Tb-Cancel-Token from a client are ignored", func(t *testing.T) {
		forged := nats.Header{schemas.HdrTenant: {"tenant-b"}, schemas.HdrKeyID: {keyB.ID},
			schemas.HdrAdapterBase: {"llama-8b"}, schemas.HdrAdapterPath: {"/etc/evil"}, schemas.HdrCancelToken: {"0"},
			schemas.HdrReserved: {"0"}, schemas.HdrWindow: {"1"}}
		s := tenantRequest(t, a, subjA, inboxA, "a-forged", 2, forged)
		testenv.WaitFor(t, 5*time.Second, endsWith(s, schemas.FrameDone, ""))
		omu.Lock()
		h := work["a-forged"]
		omu.Unlock()
		if h.Get(schemas.HdrTenant) != "tenant-a" || h.Get(schemas.HdrKeyID) != keyA.ID || h.Get(schemas.HdrAdapterBase) != "" ||
			h.Get(schemas.HdrAdapterPath) != "" || h.Get(schemas.HdrReserved) != "" || h.Get(schemas.HdrCancelToken) == "0" {
			t.Fatalf("forwarded headers %v", h)
		}
	})

	t.Run("usage and limits apply to NATS-native requests", func(t *testing.T) {
		testenv.WaitFor(t, 3*time.Second, func() error {
			omu.Lock()
			defer omu.Unlock()
			for _, r := range usage {
				if r.RequestID == "a-forged" {
					if r.KeyID != keyA.ID || r.Tenant != "tenant-a" || r.Model != "llama-8b" || r.Usage.CompletionTokens != 2 {
						return fmt.Errorf("usage record %+v", r)
					}
					return nil
				}
			}
			return fmt.Errorf("no usage record of a-forged in %d", len(usage))
		})
		// ...and key A's records reach Redis through the usage log, each once.
		testenv.WaitFor(t, 10*time.Second, func() error {
			var n, completion int64
			omu.Lock()
			for _, r := range usage {
				if r.KeyID == keyA.ID {
					n, completion = n+1, completion+int64(r.Usage.CompletionTokens)
				}
			}
			omu.Unlock()
			rows, err := store.Usage(ctx, keyA.ID, "llama-8b")
			if err != nil || len(rows) != 1 || rows[0].Requests != n || rows[0].CompletionTokens != completion {
				return fmt.Errorf("usage of key A in Redis: %+v, %v; records published: %d, %d completion tokens", rows, err, n, completion)
			}
			return nil
		})
		subj := schemas.TenantReqSubject(keyA1.ID, "llama-8b")
		first := tenantRequest(t, a, subj, inboxA, "a-rl-1", 2, nil)
		testenv.WaitFor(t, 5*time.Second, endsWith(first, schemas.FrameDone, ""))
		second := tenantRequest(t, a, subj, inboxA, "a-rl-2", 2, nil)
		testenv.WaitFor(t, 5*time.Second, endsWith(second, schemas.FrameError, "rate_limit_exceeded"))
		if e := schemas.ParseErrorPayload(second.last().Payload); e.Status != 429 || e.RetryAfter < 1 {
			t.Fatalf("refusal %+v", e)
		}
		// B's key allows llama-8b only: its catalogue error.
		other := tenantRequest(t, b, subjB, inboxB, "b-ok", 2, nil)
		testenv.WaitFor(t, 5*time.Second, endsWith(other, schemas.FrameDone, ""))
	})

	t.Run("the deploy gateway runs a batch; tenants cannot reach batch state", func(t *testing.T) {
		_, secret, err := store.CreateKey(ctx, registry.KeySpec{Tenant: "tenant-c"})
		if err != nil {
			t.Fatal(err)
		}
		auth := []string{"Authorization", "Bearer " + secret}
		base := "http://" + gw.Addr()
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		_ = mw.WriteField("purpose", "batch")
		fw, _ := mw.CreateFormFile("file", "t.jsonl")
		for i := range 5 {
			fmt.Fprintf(fw, `{"custom_id":"c%d","method":"POST","url":"/v1/completions","body":{"model":"llama-8b","prompt":"x","max_tokens":2}}`+"\n", i)
		}
		_ = mw.Close()
		var f struct{ ID string }
		if st, raw, err := httpJSON("POST", base+"/v1/files", mw.FormDataContentType(), &body, &f, auth...); st != 200 || err != nil {
			t.Fatalf("upload as the deploy gateway: %d %v %s", st, err, raw)
		}
		var bt batchState
		if st, raw, err := httpJSON("POST", base+"/v1/batches", "application/json", strings.NewReader(
			`{"input_file_id":"`+f.ID+`","endpoint":"/v1/completions","completion_window":"24h"}`), &bt, auth...); st != 200 || err != nil {
			t.Fatalf("create: %d %v %s", st, err, raw)
		}
		testenv.WaitFor(t, 20*time.Second, func() error {
			st, raw, err := httpJSON("GET", base+"/v1/batches/"+bt.ID, "", nil, &bt, auth...)
			if err != nil || st != 200 || bt.Status != "completed" || bt.RequestCounts.Completed != 5 {
				return fmt.Errorf("batch: %d %v %s", st, err, raw)
			}
			return nil
		})
		// Another tenant's key sees nothing of it.
		_, other, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "tenant-d"})
		if st, _, _ := httpJSON("GET", base+"/v1/batches/"+bt.ID, "", nil, nil, "Authorization", "Bearer "+other); st != 404 {
			t.Fatalf("another tenant's batch: %d, want 404", st)
		}
		// A key whose model list leaves out the batch's model: the batch
		// fails validation, line by line.
		_, narrow, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "tenant-c", Models: []string{"some-other-model"}})
		nauth := []string{"Authorization", "Bearer " + narrow}
		var nb batchState
		if st, raw, err := httpJSON("POST", base+"/v1/batches", "application/json", strings.NewReader(
			`{"input_file_id":"`+f.ID+`","endpoint":"/v1/completions","completion_window":"24h"}`), &nb, nauth...); st != 200 || err != nil {
			t.Fatalf("create with the narrow key: %d %v %s", st, err, raw)
		}
		testenv.WaitFor(t, 20*time.Second, func() error {
			st, raw, err := httpJSON("GET", base+"/v1/batches/"+nb.ID, "", nil, &nb, nauth...)
			if err != nil || st != 200 || nb.Status != "failed" || !strings.Contains(string(raw), `"code":"model_not_allowed"`) {
				return fmt.Errorf("batch of the narrow key: %d %v %s", st, err, raw)
			}
			return nil
		})
		for _, subj := range []string{"tokenbus.v1.batch.work.x", "$KV.TOKENBUS_BATCHES.x", "$JS.API.STREAM.INFO.TOKENBUS_BATCH"} {
			_ = b.Publish(subj, []byte("{}"))
			testenv.WaitFor(t, 3*time.Second, b.violated("publish", subj))
		}
	})
}
