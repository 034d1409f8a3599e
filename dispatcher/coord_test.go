package dispatcher

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/scheduler"
	"github.com/tokenbus/tokenbus/schemas"
)

// The slots two dispatchers divide while both have a model queued: by the
// weights of the tenants each holds, a tenant held by both split between
// them; alone, a dispatcher has no limit.
func TestDivideSlotsByDemand(t *testing.T) {
	ns := testenv.NATS(t)
	d := New(Config{ID: "d1"}, testenv.Connect(t, ns), knownModels{"m": true}, nil, nil)
	hb := []byte(`{"worker":"w","models":["m"],"max_concurrency":8,"healthy":true,"interval_ms":1000}`)
	if _, _, ok := d.fleet.Heartbeat(hb, time.Now()); !ok {
		t.Fatal("heartbeat")
	}
	now := time.Now()
	queue := func(tenant string, b schemas.Band, w float64) {
		q := d.queueFor("m")
		d.coord.weights[flowKey{"m", tenant, b}] = w
		if _, err := q.Push(&scheduler.Item{Flow: tenant, Band: b, Weight: w, Value: &queued{}}, now); err != nil {
			t.Fatal(err)
		}
	}
	peer := func(flows map[flowKey]float64) { d.coord.peers["d2"] = peer{at: now, flows: flows} }
	I, B := schemas.BandInteractive, schemas.BandBatch

	queue("a", I, 3)
	d.recomputeLocked(now)
	if d.coordinatedLocked("m") || !d.mayDispatchLocked("m", now) {
		t.Fatal("alone with a backlog: limited")
	}
	// d2 holds b (weight 1): we hold 3 of 4, so 6 of 8 slots.
	peer(map[flowKey]float64{{"m", "b", I}: 1})
	d.recomputeLocked(now)
	if c := d.coord.caps["m"]; c != 6 {
		t.Errorf("our slots with a(3) against b(1): %d, want 6", c)
	}
	// d2 holds a too: a counts half here, so we hold 1.5 of 4: 3 slots; a's
	// weight in our queue is halved.
	peer(map[flowKey]float64{{"m", "b", I}: 1, {"m", "a", I}: 3})
	d.recomputeLocked(now)
	if c, n := d.coord.caps["m"], d.coord.split[flowKey{"m", "a", I}]; c != 3 || n != 2 {
		t.Errorf("a held by both: %d slots, a split %v ways; want 3, 2", c, n)
	}
	if w, _ := d.flowWeightLocked("m", "a", I, 3); w != 1.5 {
		t.Errorf("a's weight in our queue %v, want 1.5", w)
	}
	// d2 has a critical backlog and we only interactive: the band is strict,
	// we get nothing (0 slots) until it is served.
	peer(map[flowKey]float64{{"m", "ops", schemas.BandCritical}: 1})
	d.recomputeLocked(now)
	if c, ok := d.coord.caps["m"]; !ok || c != 0 {
		t.Errorf("under another's critical backlog: %d slots (%v), want 0", c, ok)
	}
	d.coord.inflight["m"] = 0
	if d.mayDispatchLocked("m", now) {
		t.Error("may dispatch interactive work under another's critical backlog")
	}
	// Over another's batch backlog, the top band queued is ours alone: all
	// the slots are ours (and the other gets none until ours is served).
	peer(map[flowKey]float64{{"m", "nightly", B}: 1})
	d.recomputeLocked(now)
	if c := d.coord.caps["m"]; c != 8 {
		t.Errorf("over another's batch backlog: %d slots, want all 8", c)
	}
	// A peer silent past peerTTL is forgotten.
	d.recomputeLocked(now.Add(peerTTL + time.Millisecond))
	if d.coordinatedLocked("m") {
		t.Error("a silent peer still limits us")
	}
}

// Announcements travel on the bus and are read back as flows.
func TestAnnounceFlows(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	got := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(schemas.FlowsPrefix+"*", got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	d := New(Config{ID: "d1"}, nc, knownModels{"m": true}, nil, nil)
	now := time.Now()
	d.coord.weights[flowKey{"m", "a", schemas.BandBatch}] = 2
	if _, err := d.queueFor("m").Push(&scheduler.Item{Flow: "a", Band: schemas.BandBatch, Weight: 2, Value: &queued{}}, now); err != nil {
		t.Fatal(err)
	}
	d.announceLocked(now, true)
	select {
	case m := <-got:
		other := New(Config{ID: "d2"}, nc, knownModels{"m": true}, nil, nil)
		other.onFlows(m)
		p, ok := other.coord.peers["d1"]
		if !ok || p.flows[flowKey{"m", "a", schemas.BandBatch}] != 2 {
			t.Fatalf("d2 read %+v from %s", p, m.Data)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no announcement")
	}
}
