package workers

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// usageLog is a UsageSink that keeps what it gets.
type usageLog struct {
	mu   sync.Mutex
	recs []schemas.UsageRecord
}

func (u *usageLog) Record(r schemas.UsageRecord) {
	u.mu.Lock()
	u.recs = append(u.recs, r)
	u.mu.Unlock()
}

func (u *usageLog) all() []schemas.UsageRecord {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]schemas.UsageRecord(nil), u.recs...)
}

// A request a dispatcher admitted for a key (Tb-Key-Id) is recorded by the
// worker, with what admission reserved; a gateway's request (no Tb-Key-Id)
// is not: its gateway records it, and must be the only one to.
func TestUsageOfTenantRequests(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	close(eng.release)
	log := &usageLog{}
	startWorker(t, nc, eng, Config{ID: "w1", Usage: log})
	tenant := send(t, nc, schemas.WorkSubject("w1"), "t1", map[string]string{
		schemas.HdrKeyID: "key_a", schemas.HdrTenant: "tenant-a", schemas.HdrReserved: "64", schemas.HdrWindow: "99"})
	gw := send(t, nc, schemas.WorkSubject("w1"), "g1", map[string]string{schemas.HdrTenant: "tenant-a"})
	for _, f := range []*frames{tenant, gw} {
		testenv.WaitFor(t, 2*time.Second, func() error {
			if ty := f.last().Type; ty != schemas.FrameDone {
				return fmt.Errorf("last frame %q", ty)
			}
			return nil
		})
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := len(log.all()); n != 1 {
			return fmt.Errorf("%d usage records, want 1", n)
		}
		return nil
	})
	want := schemas.UsageRecord{RequestID: "t1", KeyID: "key_a", Tenant: "tenant-a", Model: "m",
		Usage: schemas.Usage{CompletionTokens: 1}, Reserved: 64, Window: 99}
	if got := log.all()[0]; got != want {
		t.Fatalf("usage record %+v, want %+v", got, want)
	}
}

// The default sink publishes each record as JSON on the usage subject.
func TestUsagePublishedOnNATS(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	got := make(chan *nats.Msg, 4)
	sub, _ := nc.ChanSubscribe(schemas.UsagePrefix+">", got)
	defer sub.Unsubscribe()
	eng := &gateEngine{release: make(chan struct{})}
	close(eng.release)
	startWorker(t, nc, eng, Config{ID: "w1"})
	send(t, nc, schemas.WorkSubject("w1"), "t1", map[string]string{schemas.HdrKeyID: "key_a", schemas.HdrTenant: "tenant-a"})
	select {
	case m := <-got:
		if m.Subject != schemas.UsagePrefix+"w1" || string(m.Data) != `{"request_id":"t1","key_id":"key_a","tenant":"tenant-a","model":"m","usage":{"prompt_tokens":0,"completion_tokens":1,"total_tokens":0}}` {
			t.Fatalf("usage message on %s: %s", m.Subject, m.Data)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no usage record published")
	}
}

// Tb-Model, which a dispatcher set from the subject, is the model: a body
// naming another is model_mismatch and never reaches the engine.
func TestBodyModelMustMatch(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	close(eng.release)
	startWorker(t, nc, eng, Config{ID: "w1"})
	f := &frames{}
	inbox := nats.NewInbox()
	sub, _ := nc.Subscribe(inbox, func(m *nats.Msg) {
		fr, _ := schemas.ParseFrame(m.Data)
		fr.Payload = append([]byte(nil), fr.Payload...)
		f.mu.Lock()
		f.got = append(f.got, fr)
		f.mu.Unlock()
	})
	defer sub.Unsubscribe()
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, "mm")
	h.Set(schemas.HdrKind, "chat")
	h.Set(schemas.HdrModel, "m")
	nc.PublishMsg(&nats.Msg{Subject: schemas.WorkSubject("w1"), Reply: inbox, Header: h,
		Data: []byte(`{"model":"m-lora","messages":[{"role":"user","content":"hi"}]}`)})
	testenv.WaitFor(t, 2*time.Second, wantTypes(f, schemas.FrameError))
	if e := schemas.ParseErrorPayload(f.last().Payload); e.Status != 400 || e.Body.Code == nil || *e.Body.Code != "model_mismatch" {
		t.Fatalf("error %+v", e)
	}
	if eng.started.Load() != 0 {
		t.Fatal("the engine ran a request whose body names another model")
	}
}
