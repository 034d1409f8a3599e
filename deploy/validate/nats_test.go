package validate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"golang.org/x/crypto/bcrypt"
)

const natsConf = "deploy/nats/nats.conf"

// Passwords for the tests; nats.conf reads them from the environment.
var testPasswords = map[string]string{
	"NATS_SYS_PASSWORD":        "sys-secret",
	"NATS_GATEWAY_PASSWORD":    "gw-secret",
	"NATS_DISPATCHER_PASSWORD": "disp-secret",
	"NATS_WORKER_PASSWORD":     "worker-secret",
	"NATS_OPERATOR_PASSWORD":   "op-secret",
	"NATS_TENANT_A_PASSWORD":   "tenant-a-secret",
}

func setEnv(t *testing.T, env map[string]string) {
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// natsOpts parses deploy/nats/nats.conf with nats-server's own parser.
func natsOpts(t *testing.T) *server.Options {
	t.Helper()
	opts, err := server.ProcessConfigFile(repoPath(t, natsConf))
	if err != nil {
		t.Fatalf("%s: %v", natsConf, err)
	}
	return opts
}

// startNATS runs the example configuration in-process on a free loopback port.
func startNATS(t *testing.T) *server.Server {
	t.Helper()
	opts := natsOpts(t)
	opts.Host = "127.0.0.1"
	opts.Port = -1
	opts.HTTPHost, opts.HTTPPort = "", 0 // no monitoring listener
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func TestNATSConfig(t *testing.T) {
	setEnv(t, testPasswords)
	opts := natsOpts(t)
	if opts.SystemAccount != "SYS" {
		t.Errorf("system_account %q", opts.SystemAccount)
	}
	if !opts.JetStream {
		t.Error("JetStream is off")
	}
	if opts.MaxPayload != 8<<20 {
		t.Errorf("max_payload %d, want 8MB (the gateway's --body-limit)", opts.MaxPayload)
	}
	if opts.HTTPPort != 8222 {
		t.Errorf("monitoring port %d, want 8222 (compose healthcheck)", opts.HTTPPort)
	}
	accounts := map[string]*server.Account{}
	for _, a := range opts.Accounts {
		accounts[a.Name] = a
	}
	for _, name := range []string{"SYS", "TOKENBUS"} {
		if accounts[name] == nil {
			t.Errorf("no account %s", name)
		}
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	for _, role := range []string{"gateway", "dispatcher", "worker", "operator", "tenant-a"} {
		u := users[role]
		if u == nil || u.Account == nil || u.Account.Name != "TOKENBUS" {
			t.Errorf("user %s: want one in account TOKENBUS", role)
		}
	}
	for _, u := range opts.Users {
		// allow_responses would let a tenant pick where a worker publishes.
		if u.Permissions != nil && u.Permissions.Response != nil {
			t.Errorf("user %s has allow_responses (see the comment at the top of %s)", u.Username, natsConf)
		}
	}
	if len(opts.Nkeys) != 1 || opts.Nkeys[0].Account == nil || opts.Nkeys[0].Account.Name != "TOKENBUS" {
		t.Error("want one nkey user (tenant-b), in account TOKENBUS")
	}

	// Every $VARIABLE the file reads is one the compose nats service sets.
	conf := string(readFile(t, natsConf))
	var uncommented strings.Builder
	for _, line := range strings.Split(conf, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		uncommented.WriteString(line + "\n")
	}
	nats := loadCompose(t).Services["nats"]
	// A quoted "$JS.API..." is a literal subject, not a variable.
	unquoted := regexp.MustCompile(`"[^"\n]*"`).ReplaceAllString(uncommented.String(), `""`)
	for _, m := range regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`).FindAllStringSubmatch(unquoted, -1) {
		if _, ok := nats.Environment[m[1]]; !ok {
			t.Errorf("%s reads $%s, which the compose nats service does not set", natsConf, m[1])
		}
		if _, ok := testPasswords[m[1]]; !ok {
			t.Errorf("%s reads $%s, which this test does not set", natsConf, m[1])
		}
	}
}

// TestComposeNATSCredentials: with the compose defaults, every tokenbus
// service logs in as a user of the TOKENBUS account with its password.
func TestComposeNATSCredentials(t *testing.T) {
	p := loadCompose(t, "*")
	nats := p.Services["nats"]
	for k, v := range nats.Environment {
		if strings.HasPrefix(k, "NATS_") && v != nil {
			t.Setenv(k, *v)
		}
	}
	users := map[string]*server.User{}
	for _, u := range natsOpts(t).Users {
		users[u.Username] = u
	}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if !isTokenbus(s) {
			continue
		}
		role := s.Command[0]
		user := env(s, "TOKENBUS_NATS_USER")
		u := users[user]
		switch {
		case user != role:
			t.Errorf("%s: NATS user %q, want the %s role's user", name, user, role)
		case u == nil:
			t.Errorf("%s: NATS user %q is not in %s", name, user, natsConf)
		case u.Password != env(s, "TOKENBUS_NATS_PASSWORD"):
			t.Errorf("%s: TOKENBUS_NATS_PASSWORD differs from the nats service's password for %s", name, user)
		case u.Account.Name != "TOKENBUS":
			t.Errorf("%s: user %s is in account %s", name, user, u.Account.Name)
		}
	}
}

// TestNATSBcryptPassword: the documented way to keep plain passwords out of
// the server: a bcrypt hash, quoted, in the environment variable.
func TestNATSBcryptPassword(t *testing.T) {
	setEnv(t, testPasswords)
	hash, err := bcrypt.GenerateFromPassword([]byte("op-secret"), 11)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_OPERATOR_PASSWORD", `"`+string(hash)+`"`)
	ns := startNATS(t)
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("operator", "op-secret"))
	if err != nil {
		t.Fatalf("operator with a bcrypt'd password: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("operator", "wrong")); err == nil {
		nc.Close()
		t.Fatal("wrong password accepted")
	}
}

// conn is a test connection that records asynchronous errors (permission
// violations arrive that way).
type conn struct {
	*nats.Conn
	name string
	mu   sync.Mutex
	errs []string
	cond chan struct{}
}

func connect(t *testing.T, ns *server.Server, name string, opts ...nats.Option) *conn {
	t.Helper()
	c := &conn{name: name, cond: make(chan struct{}, 1000)}
	opts = append(opts, nats.Name(name), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		c.mu.Lock()
		c.errs = append(c.errs, err.Error())
		c.mu.Unlock()
		c.cond <- struct{}{}
	}))
	nc, err := nats.Connect(ns.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("%s: connect: %v", name, err)
	}
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c
}

// violation waits for a permissions violation naming op ("publish" or
// "subscription") and subject.
func (c *conn) violation(t *testing.T, op, subject string) {
	t.Helper()
	want := strings.ToLower(fmt.Sprintf("permissions violation for %s to %q", op, subject))
	if strings.HasSuffix(op, " of") { // "publish with reply of"
		want = strings.ToLower(fmt.Sprintf("permissions violation for %s %q", op, subject))
	}
	deadline := time.After(3 * time.Second)
	for {
		c.mu.Lock()
		for i, e := range c.errs {
			if strings.Contains(strings.ToLower(e), want) {
				c.errs = slices.Delete(c.errs, i, i+1)
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		select {
		case <-c.cond:
		case <-deadline:
			t.Errorf("%s: no %q violation (errors: %q)", c.name, want, c.errs)
			return
		}
	}
}

func (c *conn) noErrors(t *testing.T) {
	t.Helper()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		t.Errorf("%s: unexpected errors %q", c.name, c.errs)
	}
}

func frame(typ string, seq int, payload string) []byte {
	return []byte(fmt.Sprintf("%s %d\n%s", typ, seq, payload))
}

// readFrames reads frames from sub until a done or error frame.
func readFrames(t *testing.T, sub *nats.Subscription) []string {
	t.Helper()
	var got []string
	for {
		m, err := sub.NextMsg(3 * time.Second)
		if err != nil {
			t.Fatalf("after frames %q: %v", got, err)
		}
		head, _, _ := strings.Cut(string(m.Data), "\n")
		got = append(got, head)
		if strings.HasPrefix(head, "done ") || strings.HasPrefix(head, "error ") {
			return got
		}
	}
}

// fakeTokenbus runs a dispatcher and workers over real connections with the
// dispatcher and worker users: enough of the protocol to carry a request from
// any client to a worker and its reply stream back (queued from the
// dispatcher, accepted/chunk/done from the worker, a bounce from a full
// worker), so that every hop runs under the real permissions.
type fakeTokenbus struct {
	w1       *conn
	mu       sync.Mutex
	cancels  []string // bodies seen on the worker's cancel subject
	qcancels []string
	ctl      int // control requests w1 received
}

func startFakeTokenbus(t *testing.T, ns *server.Server) *fakeTokenbus {
	t.Helper()
	f := &fakeTokenbus{}
	disp := connect(t, ns, "dispatcher", nats.UserInfo("dispatcher", testPasswords["NATS_DISPATCHER_PASSWORD"]))
	full := connect(t, ns, "worker-full", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]))
	w1 := connect(t, ns, "worker-w1", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]))
	f.w1 = w1

	forward := func(m *nats.Msg, to string) {
		fwd := nats.NewMsg(to)
		fwd.Reply = m.Reply
		fwd.Data = m.Data
		fwd.Header = m.Header
		fwd.Header.Set("Tb-Bounce", "tokenbus.v1.bounce.d1")
		if err := disp.PublishMsg(fwd); err != nil {
			t.Error(err)
		}
	}
	// Dispatcher: every request goes first to the full worker (which bounces
	// it back), then to w1. It also says `queued` to the requester first.
	take := func(m *nats.Msg) {
		_ = disp.Publish(m.Reply, frame("queued", 0, `{"position":1,"dispatcher":"d1","timeout_ms":60000}`))
		forward(m, "tokenbus.v1.work.full")
	}
	// Requests of the gateway and operators (req.>) and of tenants (treq.>).
	for _, subj := range []string{"tokenbus.v1.req.>", "tokenbus.v1.treq.>"} {
		if _, err := disp.QueueSubscribe(subj, "tokenbus-dispatchers", take); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := disp.Subscribe("tokenbus.v1.bounce.d1", func(m *nats.Msg) { forward(m, "tokenbus.v1.work.w1") }); err != nil {
		t.Fatal(err)
	}
	if _, err := disp.Subscribe("tokenbus.v1.qcancel", func(m *nats.Msg) {
		f.mu.Lock()
		f.qcancels = append(f.qcancels, string(m.Data))
		f.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := disp.Subscribe("tokenbus.v1.hb.*", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	// The full worker hands every request back (with the client's reply subject).
	if _, err := full.Subscribe("tokenbus.v1.work.full", func(m *nats.Msg) {
		b := nats.NewMsg(m.Header.Get("Tb-Bounce"))
		b.Reply, b.Data, b.Header = m.Reply, m.Data, m.Header
		if err := full.PublishMsg(b); err != nil {
			t.Error(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	// w1 streams the reply: accepted, two chunks, a keepalive, done; then a
	// done notice and a heartbeat of its own.
	if _, err := w1.Subscribe("tokenbus.v1.work.w1", func(m *nats.Msg) {
		id := m.Header.Get("Tb-Request-Id")
		for i, f := range [][]byte{
			frame("accepted", 1, fmt.Sprintf(`{"request_id":%q,"worker":"w1","cancel":"tokenbus.v1.cancel.w1"}`, id)),
			frame("chunk", 2, `{"choices":[{"delta":{"content":"Hel"}}]}`),
			frame("chunk", 3, `{"choices":[{"delta":{"content":"lo"}}]}`),
			frame("keepalive", 4, ""),
			frame("done", 5, `{"usage":{"completion_tokens":2}}`),
		} {
			if err := w1.Publish(m.Reply, f); err != nil {
				t.Errorf("frame %d: %v", i, err)
			}
		}
		_ = w1.Publish("tokenbus.v1.done.w1", []byte(fmt.Sprintf(`{"worker":"w1","request_id":%q}`, id)))
		_ = w1.Publish("tokenbus.v1.hb.w1", []byte(`{"worker":"w1"}`))
		_ = w1.Publish("tokenbus.v1.usage.w1", []byte(fmt.Sprintf(`{"request_id":%q}`, id)))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.Subscribe("tokenbus.v1.cancel.w1", func(m *nats.Msg) {
		f.mu.Lock()
		f.cancels = append(f.cancels, string(m.Data))
		f.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	// Control requests (drain, load_adapter) answered through allow_responses.
	if _, err := w1.Subscribe("tokenbus.v1.ctl.w1.*", func(m *nats.Msg) {
		f.mu.Lock()
		f.ctl++
		f.mu.Unlock()
		_ = m.Respond([]byte(`{"ok":true}`))
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*conn{disp, full, w1} {
		c.noErrors(t)
	}
	return f
}

var wantFrames = []string{"queued 0", "accepted 1", "chunk 2", "chunk 3", "keepalive 4", "done 5"}

// request publishes one chat request the way a tokenbus client does: one
// wildcard subscription on an inbox prefix, a reply subject under it.
func request(t *testing.T, c *conn, subject, inboxPrefix, id string, hdr nats.Header) []string {
	t.Helper()
	prefix := inboxPrefix + "." + nuid.Next()
	sub, err := c.SubscribeSync(prefix + ".*")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	m := nats.NewMsg(subject)
	m.Reply = prefix + "." + id
	m.Header = nats.Header{"Tb-Request-Id": {id}, "Tb-Kind": {"chat"}}
	for k, v := range hdr {
		m.Header[k] = v
	}
	m.Data = []byte(`{"model":"llama-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if err := c.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	return readFrames(t, sub)
}

func TestNATSPermissions(t *testing.T) {
	setEnv(t, testPasswords)
	ns := startNATS(t)
	f := startFakeTokenbus(t, ns)

	gw := connect(t, ns, "gateway", nats.UserInfo("gateway", testPasswords["NATS_GATEWAY_PASSWORD"]))
	tenantA := connect(t, ns, "tenant-a", nats.UserInfo("tenant-a", testPasswords["NATS_TENANT_A_PASSWORD"]),
		nats.CustomInboxPrefix("_INBOX.tenant-a"))
	nkeyOpt, err := nats.NkeyOptionFromSeed(repoPath(t, "deploy/nats/tenant-b.nk"))
	if err != nil {
		t.Fatal(err)
	}
	tenantB := connect(t, ns, "tenant-b", nkeyOpt, nats.CustomInboxPrefix("_INBOX.tenant-b"))

	t.Run("gateway request and reply stream", func(t *testing.T) {
		got := request(t, gw, "tokenbus.v1.req.llama-8b", "_INBOX", "gw-1", nil)
		if !slices.Equal(got, wantFrames) {
			t.Errorf("frames %q, want %q", got, wantFrames)
		}
		gw.noErrors(t)
	})

	t.Run("tenant-a request and reply stream", func(t *testing.T) {
		got := request(t, tenantA, "tokenbus.v1.treq.key_example_a.llama-8b", "_INBOX.tenant-a", "ta-1", nil)
		if !slices.Equal(got, wantFrames) {
			t.Errorf("frames %q, want %q", got, wantFrames)
		}
		// A model name with '.' and '/' travels as its model token.
		got = request(t, tenantA, "tokenbus.v1.treq.key_example_a.meta-llama~2fLlama-3~2e1-8B", "_INBOX.tenant-a", "ta-2", nil)
		if !slices.Equal(got, wantFrames) {
			t.Errorf("frames %q, want %q", got, wantFrames)
		}
		tenantA.noErrors(t)
	})

	t.Run("tenant-a cancels", func(t *testing.T) {
		if err := tenantA.Publish("tokenbus.v1.cancel.w1", []byte("ta-1")); err != nil {
			t.Fatal(err)
		}
		if err := tenantA.Publish("tokenbus.v1.qcancel", []byte("ta-2")); err != nil {
			t.Fatal(err)
		}
		tenantA.noErrors(t)
		waitFor(t, func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return slices.Contains(f.cancels, "ta-1") && slices.Contains(f.qcancels, "ta-2")
		}, "the worker to get the cancel and the dispatcher the qcancel")
	})

	t.Run("tenant-a may subscribe only to its inbox", func(t *testing.T) {
		for _, subj := range []string{
			"tokenbus.v1.work.>", "tokenbus.v1.hb.>", "tokenbus.v1.hb.*", "tokenbus.v1.req.>",
			"tokenbus.v1.done.*", "tokenbus.v1.cancel.*", "tokenbus.v1.ctl.>", "tokenbus.v1.events.>",
			"_INBOX.tenant-b.>", "_INBOX.>", "_INBOX.*.>", "_INBOX.*.*", "_INBOX.abcdef.*", "_INBOX", ">", "*.>",
		} {
			if _, err := tenantA.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			tenantA.violation(t, "subscription", subj)
		}
		// Queue subscriptions are no way around it.
		if _, err := tenantA.QueueSubscribeSync("tokenbus.v1.req.>", "tokenbus-dispatchers"); err != nil {
			t.Fatal(err)
		}
		tenantA.violation(t, "subscription", "tokenbus.v1.req.>")
	})

	t.Run("tenant-a may not publish around the dispatchers", func(t *testing.T) {
		for _, subj := range []string{
			"tokenbus.v1.work.w1", "tokenbus.v1.hb.w1", "tokenbus.v1.done.w1", "tokenbus.v1.bounce.d1",
			"tokenbus.v1.ctl.w1.drain", "tokenbus.v1.events.models", "_INBOX.abc.def", "_INBOX.tenant-b.x.y",
			"_INBOX.tenant-a.x.y", "$JS.API.STREAM.LIST", "tokenbus.v1.usage.w1",
			// Only the gateway and operators publish on req.> (where
			// Tb-Tenant is trusted); a tenant only on its own keys' treq.
			"tokenbus.v1.req.llama-8b", "tokenbus.v1.treq.key_example_b.llama-8b", "tokenbus.v1.treq.key_other.llama-8b",
		} {
			if err := tenantA.Publish(subj, []byte("x")); err != nil {
				t.Fatal(err)
			}
			tenantA.violation(t, "publish", subj)
		}
	})

	t.Run("tenant-b: nkey login, one model only", func(t *testing.T) {
		got := request(t, tenantB, "tokenbus.v1.treq.key_example_b.llama-8b", "_INBOX.tenant-b", "tb-1", nil)
		if !slices.Equal(got, wantFrames) {
			t.Errorf("frames %q, want %q", got, wantFrames)
		}
		tenantB.noErrors(t)
		for _, subj := range []string{"tokenbus.v1.treq.key_example_b.other-model", "tokenbus.v1.req.llama-8b",
			"tokenbus.v1.treq.key_example_a.llama-8b"} {
			if err := tenantB.Publish(subj, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			tenantB.violation(t, "publish", subj)
		}
		if _, err := tenantB.SubscribeSync("_INBOX.tenant-a.>"); err != nil {
			t.Fatal(err)
		}
		tenantB.violation(t, "subscription", "_INBOX.tenant-a.>")
	})

	t.Run("a tenant cannot aim a worker at control subjects", func(t *testing.T) {
		// The reply subject is the requester's choice, and dispatchers and
		// workers publish to it: they may do so only under _INBOX. A request
		// whose reply names a worker's control subject gets nothing written
		// there (their publishes are refused).
		f.mu.Lock()
		before := f.ctl
		f.mu.Unlock()
		m := nats.NewMsg("tokenbus.v1.treq.key_example_a.llama-8b")
		m.Reply = "tokenbus.v1.ctl.w1.drain"
		m.Header = nats.Header{"Tb-Request-Id": {"evil"}, "Tb-Kind": {"chat"}}
		m.Data = []byte(`{}`)
		if err := tenantA.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		f.w1.violation(t, "publish", m.Reply)
		f.mu.Lock()
		if f.ctl != before {
			t.Errorf("reply %s reached the worker's control subject", m.Reply)
		}
		f.mu.Unlock()
		// The server itself refuses a message that carries a JetStream API
		// subject as its reply.
		m.Reply = "$JS.API.STREAM.DELETE.X"
		if err := tenantA.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		tenantA.violation(t, "publish with reply of", m.Reply)
	})

	t.Run("roles stay in their lanes", func(t *testing.T) {
		w := connect(t, ns, "worker-x", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]))
		// A worker cannot take requests meant for dispatchers, nor write
		// into a stream it was not given.
		for _, subj := range []string{"tokenbus.v1.req.>", "_INBOX.>", "tokenbus.v1.qcancel"} {
			_, _ = w.SubscribeSync(subj)
			w.violation(t, "subscription", subj)
		}
		for _, subj := range []string{"tokenbus.v1.work.w1", "tokenbus.v1.req.llama-8b", "tokenbus.v1.ctl.w2.drain",
			"tokenbus.v1.cancel.w2", "$JS.API.STREAM.LIST"} {
			_ = w.Publish(subj, []byte("x"))
			w.violation(t, "publish", subj)
		}
		// Disaggregation (docs/disaggregation.md): a decode worker sends a
		// prefill, and its cancel, to a prefill worker's prefill subjects.
		pw := connect(t, ns, "worker-prefill", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]))
		if _, err := pw.SubscribeSync("tokenbus.v1.prefill.w2"); err != nil {
			t.Fatal(err)
		}
		_, _ = pw.SubscribeSync("tokenbus.v1.prefill.w2.cancel")
		for _, subj := range []string{"tokenbus.v1.prefill.w2", "tokenbus.v1.prefill.w2.cancel"} {
			_ = w.Publish(subj, []byte("x"))
		}
		w.noErrors(t)
		pw.noErrors(t)
		// A dispatcher takes requests only in the dispatchers' queue group
		// (no copy of every request).
		d := connect(t, ns, "dispatcher-x", nats.UserInfo("dispatcher", testPasswords["NATS_DISPATCHER_PASSWORD"]))
		_, _ = d.SubscribeSync("tokenbus.v1.req.>")
		d.violation(t, "subscription", "tokenbus.v1.req.>")
		_, _ = d.QueueSubscribeSync("tokenbus.v1.req.>", "other-group")
		d.violation(t, "subscription", "tokenbus.v1.req.>")
		_, _ = d.SubscribeSync("tokenbus.v1.treq.>")
		d.violation(t, "subscription", "tokenbus.v1.treq.>")
		_ = d.Publish("tokenbus.v1.hb.w1", []byte("{}"))
		d.violation(t, "publish", "tokenbus.v1.hb.w1")
		// Capacity on demand (docs/capacity.md): a dispatcher announces
		// demand and asks a worker to switch models, and drives no other
		// control operation.
		_ = d.Publish("tokenbus.v1.ctl.w1.drain", []byte("{}"))
		d.violation(t, "publish", "tokenbus.v1.ctl.w1.drain")
		for _, subj := range []string{"tokenbus.v1.demand.llama-8b", "tokenbus.v1.ctl.w1.switch"} {
			_ = d.Publish(subj, []byte("{}"))
		}
		d.noErrors(t)
		// The gateway does not read what is addressed to workers.
		g := connect(t, ns, "gateway-x", nats.UserInfo("gateway", testPasswords["NATS_GATEWAY_PASSWORD"]))
		for _, subj := range []string{"tokenbus.v1.work.>", "tokenbus.v1.req.>", "tokenbus.v1.cancel.*"} {
			_, _ = g.SubscribeSync(subj)
			g.violation(t, "subscription", subj)
		}
		// Its embedded dispatcher announces demand too.
		_ = g.Publish("tokenbus.v1.demand.llama-8b", []byte("{}"))
		g.noErrors(t)
	})

	t.Run("a starting worker pings its id", func(t *testing.T) {
		// As tokenbus worker does before it serves: a reply means the id is taken.
		w := connect(t, ns, "worker-start", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]),
			nats.CustomInboxPrefix("_INBOX.workers"))
		if _, err := w.Request("tokenbus.v1.ctl.w1.ping", nil, 3*time.Second); err != nil {
			t.Fatalf("ping: %v", err)
		}
		w.noErrors(t)
	})

	t.Run("usage records: gateways and workers publish, a gateway consumes", func(t *testing.T) {
		// What package usage does, on the gateway's and a worker's
		// connections: the gateway makes the stream and its consumer, both
		// publish with an ack, the gateway pulls and acks.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g := connect(t, ns, "gateway-usage", nats.UserInfo("gateway", testPasswords["NATS_GATEWAY_PASSWORD"]))
		gjs, err := jetstream.New(g.Conn)
		if err != nil {
			t.Fatal(err)
		}
		st, err := gjs.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "TOKENBUS_USAGE",
			Subjects: []string{"tokenbus.v1.usage.>"}, Retention: jetstream.WorkQueuePolicy, Discard: jetstream.DiscardNew,
			MaxBytes: 1 << 20})
		if err != nil {
			t.Fatalf("gateway creates the usage stream: %v", err)
		}
		// Again: an update, as every gateway's start does.
		if _, err := gjs.CreateOrUpdateStream(ctx, st.CachedInfo().Config); err != nil {
			t.Fatalf("gateway updates the usage stream: %v", err)
		}
		cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "tokenbus-usage",
			AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatalf("gateway creates the usage consumer: %v", err)
		}
		w := connect(t, ns, "worker-usage", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]),
			nats.CustomInboxPrefix("_INBOX.workers"))
		wjs, err := jetstream.New(w.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wjs.Publish(ctx, "tokenbus.v1.usage.worker", []byte(`{"request_id":"w"}`)); err != nil {
			t.Fatalf("worker publishes usage: %v", err)
		}
		if _, err := gjs.Publish(ctx, "tokenbus.v1.usage.gateway", []byte(`{"request_id":"g"}`)); err != nil {
			t.Fatalf("gateway publishes usage: %v", err)
		}
		batch, err := cons.Fetch(2, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatalf("gateway acks a record: %v", err)
			}
			n++
		}
		if n != 2 {
			t.Fatalf("gateway pulled %d records, want 2 (%v)", n, batch.Error())
		}
		g.noErrors(t)
		w.noErrors(t)
		// No tenant may write usage (it would bill another key), and the
		// gateway's JetStream grant is this stream's, no other.
		_ = tenantA.Publish("tokenbus.v1.usage.gateway", []byte(`{}`))
		tenantA.violation(t, "publish", "tokenbus.v1.usage.gateway")
		for _, subj := range []string{"$JS.API.STREAM.DELETE.TOKENBUS_USAGE", "$JS.API.STREAM.PURGE.TOKENBUS_USAGE", "$JS.API.STREAM.CREATE.OTHER"} {
			_ = g.Publish(subj, nil)
			g.violation(t, "publish", subj)
		}
		_ = w.Publish("$JS.API.STREAM.PURGE.TOKENBUS_USAGE", nil)
		w.violation(t, "publish", "$JS.API.STREAM.PURGE.TOKENBUS_USAGE")
	})

	t.Run("prefix-cache events: workers publish, dispatchers and gateways read", func(t *testing.T) {
		w := connect(t, ns, "worker-kv", nats.UserInfo("worker", testPasswords["NATS_WORKER_PASSWORD"]))
		d := connect(t, ns, "dispatcher-kv", nats.UserInfo("dispatcher", testPasswords["NATS_DISPATCHER_PASSWORD"]))
		g := connect(t, ns, "gateway-kv", nats.UserInfo("gateway", testPasswords["NATS_GATEWAY_PASSWORD"]))
		var subs []*nats.Subscription
		for _, c := range []*conn{d, g} {
			sub, err := c.SubscribeSync("tokenbus.v1.kv.*")
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, sub)
			c.noErrors(t)
		}
		if err := w.Publish("tokenbus.v1.kv.w1", []byte(`{"worker":"w1"}`)); err != nil {
			t.Fatal(err)
		}
		w.noErrors(t)
		for i, sub := range subs {
			if _, err := sub.NextMsg(3 * time.Second); err != nil {
				t.Errorf("reader %d: %v", i, err)
			}
		}
		// A tenant can neither feed the routing nor watch what is cached.
		_ = tenantA.Publish("tokenbus.v1.kv.w1", []byte(`{}`))
		tenantA.violation(t, "publish", "tokenbus.v1.kv.w1")
		_, _ = tenantA.SubscribeSync("tokenbus.v1.kv.*")
		tenantA.violation(t, "subscription", "tokenbus.v1.kv.*")
	})

	t.Run("the gateway's JetStream: tokenbus's streams, none deleted", func(t *testing.T) {
		// What batch.Open and responses.Open create, on the gateway's
		// connection; then what no feature does is refused.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g := connect(t, ns, "gateway-js", nats.UserInfo("gateway", testPasswords["NATS_GATEWAY_PASSWORD"]))
		js, err := jetstream.New(g.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "TOKENBUS_FILES"}); err != nil {
			t.Errorf("files: %v", err)
		}
		for _, b := range []string{"TOKENBUS_BATCHES", "TOKENBUS_RESPONSES"} {
			if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b}); err != nil {
				t.Errorf("%s: %v", b, err)
			}
		}
		for name, subj := range map[string]string{"TOKENBUS_BATCH": "tokenbus.v1.batch.work.*",
			"TOKENBUS_BATCH_RESULTS": "tokenbus.v1.batch.result.>", "TOKENBUS_RESPONSE_EVENTS": "tokenbus.v1.responses.events.*",
			"TOKENBUS_RESPONSE_WORK": "tokenbus.v1.responses.work.*"} {
			if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		g.noErrors(t)
		streams := []string{"OBJ_TOKENBUS_FILES", "KV_TOKENBUS_BATCHES", "KV_TOKENBUS_RESPONSES", "TOKENBUS_BATCH",
			"TOKENBUS_BATCH_RESULTS", "TOKENBUS_RESPONSE_EVENTS", "TOKENBUS_RESPONSE_WORK", "TOKENBUS_USAGE"}
		// (Purging KV_TOKENBUS_RESPONSES is allowed: a response is deleted
		// by purging its subject, which writes nothing, so that a full store
		// can still be emptied.)
		refused := []string{"$JS.API.STREAM.LIST", "$JS.API.STREAM.NAMES", "$JS.API.ACCOUNT.PURGE.TOKENBUS",
			"$JS.API.STREAM.PURGE.KV_TOKENBUS_BATCHES",
			"$JS.API.STREAM.PURGE.TOKENBUS_RESPONSE_WORK", "$JS.API.STREAM.MSG.DELETE.KV_TOKENBUS_RESPONSES",
			"$JS.API.CONSUMER.CREATE.OTHER.x", "$JS.API.DIRECT.GET.OTHER"}
		for _, st := range streams {
			refused = append(refused, "$JS.API.STREAM.DELETE."+st, "$JS.API.STREAM.SNAPSHOT."+st,
				"$JS.API.STREAM.RESTORE."+st, "$JS.API.CONSUMER.PAUSE."+st+".x")
		}
		for _, subj := range refused {
			_ = g.Publish(subj, nil)
			g.violation(t, "publish", subj)
		}
		// The workers, dispatchers and tenants have no JetStream API at all.
		for _, c := range []*conn{f.w1, tenantA} {
			_ = c.Publish("$JS.API.STREAM.INFO.TOKENBUS_BATCH", nil)
			c.violation(t, "publish", "$JS.API.STREAM.INFO.TOKENBUS_BATCH")
		}
	})

	t.Run("operator drives a worker's control subject", func(t *testing.T) {
		op := connect(t, ns, "operator", nats.UserInfo("operator", testPasswords["NATS_OPERATOR_PASSWORD"]))
		m, err := op.Request("tokenbus.v1.ctl.w1.drain", []byte("{}"), 3*time.Second)
		if err != nil {
			t.Fatalf("ctl request: %v", err)
		}
		if string(m.Data) != `{"ok":true}` {
			t.Errorf("ctl reply %q", m.Data)
		}
		// The gateway (admin API) may do the same.
		if _, err := gw.Request("tokenbus.v1.ctl.w1.drain", []byte("{}"), 3*time.Second); err != nil {
			t.Errorf("gateway ctl request: %v", err)
		}
	})

	t.Run("wrong credentials", func(t *testing.T) {
		for _, o := range []nats.Option{
			nats.UserInfo("tenant-a", "wrong"),
			nats.UserInfo("gateway", testPasswords["NATS_TENANT_A_PASSWORD"]),
			nil,
		} {
			var opts []nats.Option
			if o != nil {
				opts = append(opts, o)
			}
			if nc, err := nats.Connect(ns.ClientURL(), opts...); err == nil {
				nc.Close()
				t.Error("connected with wrong or no credentials")
			}
		}
	})
}

// TestNATSJetStreamLimits: the limits nats.conf sets are the ones the
// server applies to the TOKENBUS account (as the gateway reads them), and
// a stream's MaxBytes is reserved against them at creation, as nats.conf
// says: the sum of every tokenbus stream's MaxBytes must fit in max_file.
func TestNATSJetStreamLimits(t *testing.T) {
	setEnv(t, testPasswords)
	opts := natsOpts(t)
	const gib = 1 << 30
	if opts.JetStreamMaxStore != 24*gib || opts.JetStreamMaxMemory != 256<<20 {
		t.Errorf("server max_file_store %d, max_memory_store %d", opts.JetStreamMaxStore, opts.JetStreamMaxMemory)
	}
	ns := startNATS(t)
	g := connect(t, ns, "gateway", nats.UserInfo("gateway", testPasswords["NATS_GATEWAY_PASSWORD"]))
	js, err := jetstream.New(g.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := jetstream.AccountLimits{MaxMemory: 256 << 20, MaxStore: 20 * gib, MaxStreams: 64, MaxConsumers: 32768}
	got := info.Limits
	if got.MaxMemory != want.MaxMemory || got.MaxStore != want.MaxStore || got.MaxStreams != want.MaxStreams || got.MaxConsumers != want.MaxConsumers {
		t.Errorf("TOKENBUS limits %+v, want %+v", got, want)
	}
	if got.MaxStore > opts.JetStreamMaxStore {
		t.Errorf("the account may reserve %d, more than the server's %d", got.MaxStore, opts.JetStreamMaxStore)
	}
	// 15 GiB fits; another 6 GiB does not (20 GiB in all).
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "TOKENBUS_BATCH",
		Subjects: []string{"tokenbus.v1.batch.work.*"}, MaxBytes: 15 * gib}); err != nil {
		t.Fatalf("a 15 GiB stream: %v", err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "TOKENBUS_BATCH_RESULTS",
		Subjects: []string{"tokenbus.v1.batch.result.>"}, MaxBytes: 6 * gib})
	if err == nil || !strings.Contains(err.Error(), "insufficient") {
		t.Errorf("a second stream reserving past max_file: %v, want insufficient resources", err)
	}
}

// TestNATSPrefixWildcard backs a claim of nats.conf: `*` is a wildcard only
// as a whole token, so a permission "_INBOX_*.>" does not cover
// _INBOX_tenant-a.x — which is why tenant prefixes live under "_INBOX.".
func TestNATSPrefixWildcard(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Users: []*server.User{{Username: "w", Password: "w", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"_INBOX_*.>"}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	w := connect(t, ns, "w", nats.UserInfo("w", "w"))
	_ = w.Publish("_INBOX_tenant-a.x", []byte("x"))
	w.violation(t, "publish", "_INBOX_tenant-a.x")
}

// TestNATSTenantAccountsNeedReplyHeader records why tenants are users of the
// TOKENBUS account rather than accounts of their own (docs/security.md).
// Across a service import a tenant's request arrives with a reply subject
// `_R_.…` that the server maps back to the tenant, and with a
// Nats-Request-Info header naming the tenant's account that the tenant cannot
// forge. The responder may publish to that subject. But NATS refuses any
// client message that CARRIES an `_R_.` reply, and the dispatcher forwards
// requests to workers (and workers bounce them) with the client's reply
// subject: that hop fails. Tenant accounts need the dispatcher to pass the
// reply subject in a header instead (a protocol change), after which this
// test's forwarding half flips.
func TestNATSTenantAccountsNeedReplyHeader(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(conf, []byte(`
listen: 127.0.0.1:-1
accounts {
  TOKENBUS: {
    users: [ { user: dispatcher, password: d } ]
    exports: [ { service: "tokenbus.v1.req.>", response_type: stream } ]
  }
  TENANT_A: {
    users: [ { user: tenant-a, password: t, permissions: { publish: "tokenbus.v1.req.>", subscribe: "_INBOX.tenant-a.>" } } ]
    imports: [ { service: { account: TOKENBUS, subject: "tokenbus.v1.req.>" } } ]
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.Port, opts.NoSigs, opts.NoLog = -1, true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	d := connect(t, ns, "dispatcher", nats.UserInfo("dispatcher", "d"))
	info := make(chan string, 1)
	replies := make(chan string, 1)
	if _, err := d.QueueSubscribe("tokenbus.v1.req.>", "tokenbus-dispatchers", func(m *nats.Msg) {
		info <- m.Header.Get("Nats-Request-Info")
		replies <- m.Reply
		_ = d.Publish(m.Reply, frame("queued", 0, "{}")) // a direct answer crosses back
		fwd := nats.NewMsg("tokenbus.v1.work.w1")
		fwd.Reply, fwd.Data = m.Reply, m.Data
		_ = d.PublishMsg(fwd) // forwarding with that reply is refused
	}); err != nil {
		t.Fatal(err)
	}
	d.noErrors(t)
	tenant := connect(t, ns, "tenant-a", nats.UserInfo("tenant-a", "t"))
	sub, _ := tenant.SubscribeSync("_INBOX.tenant-a.x.*")
	m := nats.NewMsg("tokenbus.v1.req.llama-8b")
	m.Reply = "_INBOX.tenant-a.x.1"
	m.Header = nats.Header{"Nats-Request-Info": {`{"acc":"TOKENBUS"}`}} // a forgery attempt
	if err := tenant.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if got, err := sub.NextMsg(2 * time.Second); err != nil || !strings.HasPrefix(string(got.Data), "queued 0") {
		t.Fatalf("direct answer through the import: %v", err)
	}
	var ci struct {
		Account string `json:"acc"`
	}
	_ = json.Unmarshal([]byte(<-info), &ci)
	if ci.Account != "TENANT_A" {
		t.Errorf("Nats-Request-Info names account %q, want TENANT_A (set by the server)", ci.Account)
	}
	reply := <-replies
	if !strings.HasPrefix(reply, "_R_.") {
		t.Errorf("reply subject seen by the dispatcher %q, want a mapped _R_. subject", reply)
	}
	d.violation(t, "publish with reply of", reply)
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
