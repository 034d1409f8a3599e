package workers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// disaggPair is a prefill worker "p" and a decode worker "d" on sim
// engines, on a real NATS server.
type disaggPair struct {
	nc         *nats.Conn
	p, d       *Worker
	pEng, dEng *sim.Engine
}

func startDisaggPair(t testing.TB, prefill func(*sim.Config), pcfg Config) *disaggPair {
	t.Helper()
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	newSim := func(f func(*sim.Config)) *sim.Engine {
		c := sim.DefaultConfig()
		c.Model = "m"
		if f != nil {
			f(&c)
		}
		e, err := sim.New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	pp := &disaggPair{nc: nc, pEng: newSim(prefill), dEng: newSim(nil)}
	start := func(id, role string, eng *sim.Engine, cfg Config) *Worker {
		cfg.ID, cfg.Role = id, role
		w, err := New(cfg, testenv.Connect(t, ns), eng, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		<-w.Ready()
		t.Cleanup(func() { cancel(); <-done })
		return w
	}
	pp.p, pp.d = start("p", schemas.RolePrefill, pp.pEng, pcfg), start("d", schemas.RoleDecode, pp.dEng, Config{})
	return pp
}

func longChat(words int, stream bool) string {
	return fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"%s"}]}`,
		stream, strings.Repeat("word ", words))
}

// A client that goes away while its request's prefill runs on the prefill
// worker (here: waits for the engine to wake up) stops it there.
func TestRemotePrefillCancelled(t *testing.T) {
	pp := startDisaggPair(t, func(c *sim.Config) { c.WakeTime = time.Minute }, Config{SleepAfter: 10 * time.Millisecond})
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !pp.pEng.Sleeping() {
			return fmt.Errorf("the prefill engine is awake")
		}
		return nil
	})
	f, inbox := collect(t, pp.nc)
	token := schemas.NewCancelToken()
	h := nats.Header{schemas.HdrRequestID: {"r1"}, schemas.HdrKind: {"chat"}, schemas.HdrModel: {"m"},
		schemas.HdrCancelToken: {token}, schemas.HdrPrefillWorker: {"p"}}
	if err := pp.nc.PublishMsg(&nats.Msg{Subject: schemas.WorkSubject("d"), Reply: inbox, Header: h, Data: []byte(longChat(500, true))}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if pp.p.Running() != 1 || pp.d.Running() != 1 {
			return fmt.Errorf("p runs %d, d runs %d", pp.p.Running(), pp.d.Running())
		}
		return nil
	})
	if err := pp.nc.Publish(schemas.CancelSubject("d"), schemas.CancelBody("r1", token)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Second, func() error {
		if pp.p.Running() != 0 || pp.d.Running() != 0 {
			return fmt.Errorf("p runs %d, d runs %d; frames %v", pp.p.Running(), pp.d.Running(), f.types())
		}
		return nil
	})
}
