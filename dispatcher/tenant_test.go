package dispatcher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// The subject is the authority on the model: a Tb-Model header or a body
// "model" that names another is model_mismatch, and reaches no worker.
func TestSubjectIsTheModel(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := New(Config{}, nc, knownModels{"m": true, "other": true}, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	t.Cleanup(func() { cancel(); <-done })
	w := newFakeWorker(t, nc, "w", 10)
	waitServing(t, d, "m", 1)
	for _, tc := range []struct{ name, header, body string }{
		{"header", "other", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"header, no body model", "other", `{"messages":[{"role":"user","content":"hi"}]}`},
		{"body", "", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`},
		{"body and header agree, subject differs", "other", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`},
	} {
		r := &replies{}
		inbox := nats.NewInbox()
		sub, _ := nc.Subscribe(inbox, func(m *nats.Msg) {
			f, _ := schemas.ParseFrame(m.Data)
			f.Payload = append([]byte(nil), f.Payload...)
			r.mu.Lock()
			r.frames = append(r.frames, f)
			r.mu.Unlock()
		})
		h := nats.Header{}
		h.Set(schemas.HdrRequestID, "mm")
		h.Set(schemas.HdrKind, "chat")
		if tc.header != "" {
			h.Set(schemas.HdrModel, tc.header)
		}
		nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("m"), Reply: inbox, Header: h, Data: []byte(tc.body)})
		testenv.WaitFor(t, 2*time.Second, func() error {
			if err := wantError(r, 400, "model_mismatch")(); err != nil {
				return fmt.Errorf("%s: %v", tc.name, err)
			}
			return nil
		})
		sub.Unsubscribe()
	}
	// A body without a model, on the subject's model, is that model.
	sendBody(t, nc, "m", "ok", `{"messages":[{"role":"user","content":"hi"}]}`)
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	if got := w.msgs()[0].Header.Get(schemas.HdrModel); got != "m" {
		t.Fatalf("forwarded Tb-Model %q", got)
	}
}

// keyTable is Keys on a map.
type keyTable map[string]registry.Key

func (k keyTable) Key(_ context.Context, id string) (registry.Key, error) {
	if key, ok := k[id]; ok {
		return key, nil
	}
	return registry.Key{}, registry.ErrNotFound
}

// admitFunc is an Admitter.
type admitFunc func(registry.Key, *schemas.Request) (Admission, error)

func (f admitFunc) Admit(_ context.Context, k registry.Key, r *schemas.Request, _ Attempt) (Admission, error) {
	return f(k, r)
}

// Tenant requests: the key on the subject decides the tenant, the models
// and the limits; replies go only into its tenant's inbox; headers only
// dispatchers may set are replaced; every request gets a fresh cancel token.
func TestTenantRequests(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	keys := keyTable{
		"key_a":  {ID: "key_a", KeySpec: registry.KeySpec{Tenant: "tenant-a", Band: "batch", Weight: 2}},
		"key_b":  {ID: "key_b", KeySpec: registry.KeySpec{Tenant: "tenant-b", Models: []string{"m"}}},
		"key_rl": {ID: "key_rl", KeySpec: registry.KeySpec{Tenant: "tenant-a", RPM: 1}},
	}
	admit := admitFunc(func(k registry.Key, r *schemas.Request) (Admission, error) {
		if k.ID == "key_rl" {
			return Admission{}, schemas.ErrRateLimited.New(k.ID, "requests per minute (RPM)", 1, 1, "12s").WithRetryAfter(12)
		}
		return Admission{Reserved: r.MaxTokens + 7, Window: 42}, nil
	})
	d := New(Config{Keys: keys, Admit: admit}, nc, knownModels{"m": true, "other": true}, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	t.Cleanup(func() { cancel(); <-done })
	w := newFakeWorker(t, nc, "w", 10)
	waitServing(t, d, "m", 1)

	send := func(keyID, model, id, reply string, extra nats.Header) *replies {
		r := &replies{}
		sub, _ := nc.Subscribe(reply, func(m *nats.Msg) {
			f, _ := schemas.ParseFrame(m.Data)
			f.Payload = append([]byte(nil), f.Payload...)
			r.mu.Lock()
			r.frames = append(r.frames, f)
			r.mu.Unlock()
		})
		t.Cleanup(func() { sub.Unsubscribe() })
		h := nats.Header{}
		for k, v := range extra {
			h[k] = v
		}
		h.Set(schemas.HdrRequestID, id)
		h.Set(schemas.HdrKind, "chat")
		body := `{"model":"` + model + `","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
		if err := nc.PublishMsg(&nats.Msg{Subject: schemas.TenantReqSubject(keyID, model), Reply: reply, Header: h, Data: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	forged := nats.Header{
		schemas.HdrTenant: {"tenant-b"}, schemas.HdrKeyID: {"key_b"}, schemas.HdrReserved: {"0"},
		schemas.HdrWindow: {"1"}, schemas.HdrCancelToken: {"guessable"}, schemas.HdrAdapterPath: {"/etc/evil"},
		schemas.HdrAdapterBase: {"m"}, schemas.HdrAttempt: {"99"}, schemas.HdrBounce: {"tokenbus.v1.bounce.x"},
		"tb-key-id": {"key_b"}, "TB-TENANT": {"tenant-b"},
		// A tenant cannot jump the queue: its key decides its flow.
		schemas.HdrBand: {"critical"}, schemas.HdrWeight: {"1000"}, schemas.HdrMaxQueue: {"1"}, "tb-band": {"critical"},
	}
	send("key_a", "m", "a1", "_INBOX.tenant-a.s.1", forged)
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	h := w.msgs()[0].Header
	want := map[string]string{
		schemas.HdrTenant: "tenant-a", schemas.HdrKeyID: "key_a", schemas.HdrReserved: "12", schemas.HdrWindow: "42",
		schemas.HdrAdapterPath: "", schemas.HdrAdapterBase: "", schemas.HdrAttempt: "", "tb-key-id": "", "TB-TENANT": "",
		schemas.HdrModel: "m",
		schemas.HdrBand:  "batch", schemas.HdrWeight: "2", schemas.HdrMaxQueue: "", "tb-band": "",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("forwarded %s = %q, want %q", k, got, v)
		}
	}
	if tok := h.Get(schemas.HdrCancelToken); len(tok) != 2*schemas.CancelTokenBytes || tok == "guessable" {
		t.Errorf("cancel token %q: not the dispatcher's", tok)
	}

	// Refused, with an answer in the tenant's own inbox.
	for _, tc := range []struct {
		name, key, model string
		status           int
		code             string
	}{
		{"model not on the key's list", "key_b", "other", 403, "model_not_allowed"},
		{"over its limit", "key_rl", "m", 429, "rate_limit_exceeded"},
	} {
		tenant := keys[tc.key].Tenant
		r := send(tc.key, tc.model, "refused", schemas.TenantInbox(tenant)+".s.2", nil)
		testenv.WaitFor(t, 2*time.Second, func() error {
			if err := wantError(r, tc.status, tc.code)(); err != nil {
				return fmt.Errorf("%s: %v", tc.name, err)
			}
			return nil
		})
		if tc.status == 429 {
			f, _ := r.last()
			if e := schemas.ParseErrorPayload(f.Payload); e.RetryAfter != 12 {
				t.Errorf("429 retry_after %d, want 12", e.RetryAfter)
			}
		}
	}
	// Dropped: a reply into another tenant's inbox (or a prefix of it), an
	// unknown key. Nothing reaches the worker, nothing reaches the inbox.
	aimed := []*replies{
		send("key_b", "m", "b1", "_INBOX.tenant-a.s.3", nil),
		send("key_b", "m", "b2", "_INBOX.tenant-bx.s.3", nil),
		send("key_b", "m", "b3", "_INBOX.s.3", nil),
		send("key_gone", "m", "g1", "_INBOX.tenant-a.s.4", nil),
	}
	send("key_b", "m", "b4", "_INBOX.tenant-b.s.5", nil)
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 2)) // b4, after the others on one connection
	if got := w.msgs()[1].Header.Get(schemas.HdrRequestID); got != "b4" {
		t.Fatalf("forwarded %q, want only b4", got)
	}
	for i, r := range aimed {
		if _, n := r.last(); n != 0 {
			t.Errorf("dropped request %d got %d frames", i, n)
		}
	}
}

func waitServing(t *testing.T, d *Dispatcher, model string, n int) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if got := d.Fleet().Serving(model); got != n {
			return fmt.Errorf("%d workers seen, want %d", got, n)
		}
		return nil
	})
}
