package workers

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// kvEngine reports one batch of KV events per value sent on next.
type kvEngine struct {
	gateEngine
	off    bool // KVEventsOn is false
	mu     sync.Mutex
	next   []schemas.KVEvents
	drains int
}

func (e *kvEngine) KVEventsOn() bool { return !e.off }

func (e *kvEngine) DrainKVEvents() (schemas.KVEvents, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drains++
	if len(e.next) == 0 {
		return schemas.KVEvents{}, false
	}
	ev := e.next[0]
	e.next = e.next[1:]
	return ev, true
}

// A worker publishes its engine's KV events on its subject, numbered, with
// its id.
func TestWorkerPublishesKVEvents(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	var mu sync.Mutex
	var got []schemas.KVEvents
	if _, err := nc.Subscribe(schemas.KVEventsPrefix+"*", func(m *nats.Msg) {
		var ev schemas.KVEvents
		if err := json.Unmarshal(m.Data, &ev); err != nil || m.Subject != schemas.KVEventsSubject(ev.Worker) {
			t.Errorf("bad message on %s: %s", m.Subject, m.Data)
		}
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	eng := &kvEngine{next: []schemas.KVEvents{
		{BlockBytes: 64, Stored: [][]uint64{{1, 2}}},
		{BlockBytes: 64, Removed: []uint64{2}},
	}}
	startWorker(t, nc, eng, Config{ID: "kvw", MaxConcurrency: 4})
	testenv.WaitFor(t, 3*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 2 {
			return fmt.Errorf("%d messages", len(got))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if got[0].Worker != "kvw" || got[0].Seq != 1 || len(got[0].Stored) != 1 || got[1].Seq != 2 || got[1].Removed[0] != 2 {
		t.Fatalf("messages %+v", got)
	}
}

// An engine that reports no KV events (vLLM without --kv-events-config) is
// never polled for them: an idle worker does not wake every 50 ms for
// nothing.
func TestNoKVEventsNoPolling(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &kvEngine{off: true, next: []schemas.KVEvents{{BlockBytes: 64, Stored: [][]uint64{{1}}}}}
	w, stop, _ := startWorker(t, nc, eng, Config{ID: "kvw", MaxConcurrency: 4})
	<-w.Ready()
	time.Sleep(4 * kvEventsEvery) // long enough for a ticker's polls; nothing to wait for instead
	stop()
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if eng.drains != 0 {
		t.Fatalf("polled %d times for KV events it does not report", eng.drains)
	}
}
