package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program/natsusers"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// TestNATSUsersCollidingTenants: tenants whose names differ only in what
// the password variable used to flatten ("team-x" and "team.x", "Acme" and
// "acme") get users, passwords and inboxes of their own from
// `tokenbus nats-users`; against a real nats-server running
// deploy/nats/nats.conf with that block, a real dispatcher and worker,
// neither can log in as the other, publish on the other's key (billed to
// it) or read the other's replies, and each one's requests are answered in
// the inbox the dispatcher computes for it (schemas.TenantInbox), which is
// the one its permissions allow. A tenant named after a deploy user, or
// "workers" (the workers' own inbox), is refused.
// Not parallel: the tenants' passwords are in the environment (t.Setenv).
func TestNATSUsersCollidingTenants(t *testing.T) {
	ctx := context.Background()
	rd, store := startStore(t)
	pairs := [][2]string{{"team-x", "team.x"}, {"Acme", "acme"}}
	keyOf := map[string]registry.Key{}
	password := map[string]string{}
	for k, v := range deployPasswords {
		t.Setenv(k, v)
	}
	for i, p := range pairs {
		for j, name := range p {
			k, _, err := store.CreateKey(ctx, registry.KeySpec{Tenant: name})
			if err != nil {
				t.Fatal(err)
			}
			keyOf[name] = k
			password[name] = fmt.Sprintf("secret-%d-%d", i, j)
			t.Setenv(natsusers.PasswordVar(name), password[name])
		}
	}
	keys, err := store.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var users bytes.Buffer
	if err := natsusers.Write(&users, natsusers.FromKeys(keys, nil)); err != nil {
		t.Fatal(err)
	}
	url, serverLog := deployNATS(t, users.Bytes())
	// A gateway too: it writes the usage records (TOKENBUS_USAGE) to Redis.
	startDeployStack(t, url, rd.URL)
	// The operator sees what reaches the worker.
	op := tconnect(t, url, nats.UserInfo("operator", deployPasswords["NATS_OPERATOR_PASSWORD"]))
	var mu sync.Mutex
	reached := map[string]bool{}
	if _, err := op.Subscribe(schemas.WorkPrefix+"w1", func(m *nats.Msg) {
		mu.Lock()
		reached[m.Header.Get(schemas.HdrRequestID)] = true
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	_ = op.Flush()

	login := func(user, pass string) (*tconn, error) {
		c := &tconn{}
		nc, err := nats.Connect(url, nats.UserInfo(user, pass), nats.CustomInboxPrefix(schemas.TenantInbox(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				c.mu.Lock()
				c.errs = append(c.errs, err.Error())
				c.mu.Unlock()
			}))
		if err != nil {
			return nil, err
		}
		t.Cleanup(nc.Close)
		c.Conn = nc
		return c, nil
	}
	conns := map[string]*tconn{}
	for _, p := range pairs {
		for _, name := range p {
			c, err := login(name, password[name])
			if err != nil {
				t.Fatalf("%s with its own password: %v", name, err)
			}
			conns[name] = c
		}
	}
	// Each one's own request is answered, in its own inbox (the dispatcher's
	// idea of it and the permissions' agree). A just-started dispatcher
	// waits for every worker's heartbeat first: the first request may wait.
	for name, c := range conns {
		s := tenantRequest(t, c, schemas.TenantReqSubject(keyOf[name].ID, "llama-8b"), schemas.TenantInbox(name)+".s", "own-"+strings.ReplaceAll(name, ".", "_"), 2, nil)
		testenv.WaitFor(t, 10*time.Second, endsWith(s, schemas.FrameDone, ""))
	}

	for _, p := range pairs {
		for _, dir := range [][2]string{{p[0], p[1]}, {p[1], p[0]}} {
			a, b := dir[0], dir[1]
			t.Run(a+" against "+b, func(t *testing.T) {
				if natsusers.PasswordVar(a) == natsusers.PasswordVar(b) {
					t.Errorf("%s and %s share the password variable %s", a, b, natsusers.PasswordVar(a))
				}
				if c, err := login(b, password[a]); err == nil {
					c.Close()
					t.Fatalf("%s's password logs in as %s", a, b)
				}
				ca, cb := conns[a], conns[b]
				// Publish billed to b: on b's key subject.
				id := "cross-" + strings.ReplaceAll(a, ".", "_")
				subj := schemas.TenantReqSubject(keyOf[b].ID, "llama-8b")
				tenantRequest(t, ca, subj, schemas.TenantInbox(a)+".s", id, 2, nil)
				testenv.WaitFor(t, 3*time.Second, ca.violated("publish", subj))
				// Read b's replies: subscribe to b's inbox.
				inbox := schemas.TenantInbox(b) + ".>"
				_, _ = ca.SubscribeSync(inbox)
				testenv.WaitFor(t, 3*time.Second, ca.violated("subscription", inbox))
				// Aim its own request's replies at b's inbox: the dispatcher
				// refuses it (b, listening there, gets nothing).
				spy := &tstream{}
				sub, _ := cb.Subscribe(schemas.TenantInbox(b)+".>", func(m *nats.Msg) {
					spy.mu.Lock()
					spy.frames = append(spy.frames, schemas.Frame{Payload: bytes.Clone(m.Data)})
					spy.mu.Unlock()
				})
				defer sub.Unsubscribe()
				_ = cb.Flush()
				aimed := "aimed-" + strings.ReplaceAll(a, ".", "_")
				tenantRequest(t, ca, schemas.TenantReqSubject(keyOf[a].ID, "llama-8b"), schemas.TenantInbox(b)+".s", aimed, 2, nil)
				after := tenantRequest(t, ca, schemas.TenantReqSubject(keyOf[a].ID, "llama-8b"), schemas.TenantInbox(a)+".s", aimed+"-own", 2, nil)
				testenv.WaitFor(t, 5*time.Second, endsWith(after, schemas.FrameDone, ""))
				mu.Lock()
				defer mu.Unlock()
				if reached[id] || reached[aimed] || len(spy.all()) != 0 {
					t.Fatalf("refused work reached the worker (%v, %v) or %s's inbox (%d frames)", reached[id], reached[aimed], b, len(spy.all()))
				}
			})
		}
	}

	t.Run("reserved names", func(t *testing.T) {
		// Every deploy user of nats.conf is a name no tenant may take.
		opts, err := server.ProcessConfigFile("../deploy/nats/nats.conf")
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range opts.Users {
			if strings.HasPrefix(u.Username, "tenant-") {
				continue // the example tenants
			}
			if _, ok := natsusers.Reserved[u.Username]; !ok {
				t.Errorf("deploy user %q is not reserved", u.Username)
			}
		}
		for _, name := range []string{"workers", "worker", "gateway", "dispatcher", "operator", "sys"} {
			k, _, err := store.CreateKey(ctx, registry.KeySpec{Tenant: name})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err = natsusers.Write(&out, natsusers.FromKeys([]registry.Key{keyOf["acme"], k}, nil))
			if err == nil || !strings.Contains(err.Error(), "reserved") || out.Len() != 0 {
				t.Errorf("tenant %q: error %v, %d bytes written", name, err, out.Len())
			}
		}
	})

	// Billed: each key exactly its tenant's two answered requests (its
	// own, and its own after the aimed one); nothing the other tried.
	for name, k := range keyOf {
		testenv.WaitFor(t, 10*time.Second, func() error {
			rows, err := store.Usage(ctx, k.ID, "")
			var n int64
			for _, r := range rows {
				n += r.Requests
			}
			if err == nil && n != 2 {
				err = fmt.Errorf("%s's key: %d requests recorded, want 2", name, n)
			}
			return err
		})
	}
	if v := serverLog.matching("authentication error"); len(v) != len(pairs)*2 {
		t.Errorf("want one refused login per direction, the server logged:\n%s", strings.Join(v, "\n"))
	}
}
