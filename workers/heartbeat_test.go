package workers

import (
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// lensEngine is a gateEngine that knows its model's context length.
type lensEngine struct {
	gateEngine
	lens map[string]int
}

func (e *lensEngine) MaxModelLens() map[string]int { return e.lens }

var _ engine.ContextLengths = (*lensEngine)(nil)

// A heartbeat carries the context lengths the engine reports, and none for
// an engine that knows none.
func TestHeartbeatMaxModelLen(t *testing.T) {
	for _, tc := range []struct {
		name string
		eng  engine.Engine
		want map[string]int
	}{
		{"engine that knows", &lensEngine{lens: map[string]int{"m": 8192}}, map[string]int{"m": 8192}},
		{"engine that does not", &gateEngine{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.NATS(t)
			nc := testenv.Connect(t, ns)
			beats := make(chan []byte, 16)
			if _, err := nc.Subscribe(schemas.HeartbeatSubject("w1"), func(m *nats.Msg) {
				select {
				case beats <- m.Data:
				default:
				}
			}); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			startWorker(t, nc, tc.eng, Config{ID: "w1"})
			var raw []byte
			select {
			case raw = <-beats:
			case <-time.After(5 * time.Second):
				t.Fatal("no heartbeat")
			}
			var hb schemas.Heartbeat
			if err := json.Unmarshal(raw, &hb); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(hb.MaxModelLen, tc.want) {
				t.Fatalf("heartbeat %s: max_model_len %v, want %v", raw, hb.MaxModelLen, tc.want)
			}
		})
	}
}

// modelsEngine is a gateEngine whose model list changes by SetModels;
// notifying, it tells the worker (engine.ModelsNotifier).
type modelsEngine struct {
	gateEngine
	mu     sync.Mutex
	models []string
	notify func()
}

func (e *modelsEngine) Models() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.models)
}

func (e *modelsEngine) setModels(m ...string) {
	e.mu.Lock()
	e.models = m
	f := e.notify
	e.mu.Unlock()
	if f != nil {
		f()
	}
}

type notifyingEngine struct{ modelsEngine }

func (e *notifyingEngine) NotifyModels(f func()) {
	e.mu.Lock()
	e.notify = f
	e.mu.Unlock()
}

var _ engine.ModelsNotifier = (*notifyingEngine)(nil)

// A change of the served models is advertised at once, not at the next
// regular beat (an hour away here): told by an engine that notifies,
// polled from one that does not.
func TestHeartbeatOnModelsChange(t *testing.T) {
	for _, tc := range []struct {
		name string
		eng  interface {
			engine.Engine
			setModels(...string)
		}
	}{
		{"notifying engine", &notifyingEngine{modelsEngine{models: []string{"m"}}}},
		{"polled engine", &modelsEngine{models: []string{"m"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.NATS(t)
			nc := testenv.Connect(t, ns)
			beats := make(chan schemas.Heartbeat, 16)
			if _, err := nc.Subscribe(schemas.HeartbeatSubject("w1"), func(m *nats.Msg) {
				var hb schemas.Heartbeat
				if json.Unmarshal(m.Data, &hb) == nil {
					beats <- hb
				}
			}); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			startWorker(t, nc, tc.eng, Config{ID: "w1", HeartbeatInterval: time.Hour})
			next := func() schemas.Heartbeat {
				t.Helper()
				select {
				case hb := <-beats:
					return hb
				case <-time.After(5 * time.Second):
					t.Fatal("no heartbeat")
					return schemas.Heartbeat{}
				}
			}
			if hb := next(); !slices.Equal(hb.Models, []string{"m"}) {
				t.Fatalf("first beat lists %v", hb.Models)
			}
			tc.eng.setModels("m", "m-lora")
			if hb := next(); !slices.Equal(hb.Models, []string{"m", "m-lora"}) {
				t.Fatalf("beat after the change lists %v", hb.Models)
			}
		})
	}
}
