package dispatcher

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// roleBeat publishes a heartbeat for worker id of role role, serving m.
func roleBeat(t *testing.T, nc *nats.Conn, id, role string, running, max int) {
	t.Helper()
	b, _ := json.Marshal(schemas.Heartbeat{Worker: id, Models: []string{"m"}, MaxConcurrency: max, Running: running, Healthy: true,
		IntervalMS: 1000, Role: role})
	if err := nc.Publish(schemas.HeartbeatSubject(id), b); err != nil {
		t.Fatal(err)
	}
}

// promptOf is a chat body whose prompt is n bytes of text (about n/4 tokens).
func promptOf(n int) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("abcd", n/4) + `"}]}`
}

func TestDisaggregationDecision(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{Disagg: DisaggConfig{MinPromptTokens: 500}})
	dec := newFakeWorker(t, nc, "dec", 8)
	roleBeat(t, nc, "dec", schemas.RoleDecode, 0, 8)
	pre := newFakeWorker(t, nc, "pre", 1)
	roleBeat(t, nc, "pre", schemas.RolePrefill, 0, 1)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 1 || d.Fleet().PrefillWorkers("m") != 1 {
			return fmt.Errorf("serving %d, prefill workers %d", d.Fleet().Serving("m"), d.Fleet().PrefillWorkers("m"))
		}
		return nil
	})
	last := func() *nats.Msg {
		dec.mu.Lock()
		defer dec.mu.Unlock()
		return dec.got[len(dec.got)-1]
	}
	tests := []struct {
		name, id, body, prefill string
	}{
		{"short prompt runs whole", "r1", promptOf(400), ""},
		{"long prompt is disaggregated", "r2", promptOf(4000), "pre"},
		// The decode worker now holds that prompt by the dispatcher's record.
		{"a prompt the decode worker holds runs whole", "r3", promptOf(4000), ""},
		// The prefill worker's one slot is taken by r2 (no done notice yet).
		{"prefill pool full: whole", "r4", strings.Replace(promptOf(4000), "abcd", "wxyz", 1), ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sendBody(t, nc, "m", tc.id, tc.body)
			testenv.WaitFor(t, 2*time.Second, wantCount(dec, i+1))
			if got := last().Header.Get(schemas.HdrPrefillWorker); got != tc.prefill {
				t.Fatalf("prefill worker %q, want %q", got, tc.prefill)
			}
		})
	}
	if pre.count() != 0 {
		t.Fatalf("the prefill worker got %d requests whole", pre.count())
	}
	for reason, want := range map[string]float64{disaggYes: 1, disaggShort: 1, disaggCached: 1, disaggPrefillFull: 1} {
		if got := counterValue(d.m.disagg.WithLabelValues(reason)); got != want {
			t.Errorf("%s decisions %v, want %v", reason, got, want)
		}
	}
	// A client cannot choose a prefill worker: its header is removed.
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, "r5")
	h.Set(schemas.HdrKind, "chat")
	h.Set(schemas.HdrPrefillWorker, "pre")
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("m"), Reply: nats.NewInbox(), Header: h, Data: []byte(promptOf(40))}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, wantCount(dec, 5))
	if m := last(); m.Header.Get(schemas.HdrPrefillWorker) != "" {
		t.Fatalf("client's disaggregation headers forwarded: %v", m.Header)
	}
}

func TestDisaggregationOffWithoutPrefillWorkers(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{Disagg: DisaggConfig{MinPromptTokens: 10}, NoPrefixRouting: true})
	w := newFakeWorker(t, nc, "w", 8)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 1 {
			return fmt.Errorf("worker not seen")
		}
		return nil
	})
	sendBody(t, nc, "m", "r1", promptOf(4000))
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	w.mu.Lock()
	got := w.got[0].Header.Get(schemas.HdrPrefillWorker)
	w.mu.Unlock()
	if got != "" {
		t.Fatalf("disaggregated with no prefill worker: %q", got)
	}
	// A prefill worker alone serves nothing: the model has no worker for whole requests.
	roleBeat(t, nc, "p", schemas.RolePrefill, 0, 8)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().PrefillWorkers("m") != 1 || d.Fleet().Serving("m") != 1 {
			return fmt.Errorf("prefill %d serving %d", d.Fleet().PrefillWorkers("m"), d.Fleet().Serving("m"))
		}
		return nil
	})
	// With prefix routing off the decision reads the prompt's length.
	sendBody(t, nc, "m", "r2", promptOf(4000))
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 2))
	w.mu.Lock()
	got = w.got[1].Header.Get(schemas.HdrPrefillWorker)
	w.mu.Unlock()
	if got != "p" {
		t.Fatalf("prefill worker %q, want p", got)
	}
}
