package workers

import (
	"encoding/json"
	"maps"
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
