package dispatcher

import (
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

func TestChooseSwitch(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	long := now.Add(-time.Hour).UnixMilli() // loaded long ago: its hold has passed
	// w is a worker serving model, able to serve a, b and c.
	w := func(id, model string, running int, edit ...func(*fleet.Worker)) fleet.Worker {
		x := fleet.Worker{Heartbeat: schemas.Heartbeat{Worker: id, Models: []string{model}, CanServe: []string{"a", "b", "c"},
			Running: running, Healthy: true, LoadedAt: long, HoldMS: 30_000}, Load: running}
		for _, f := range edit {
			f(&x)
		}
		return x
	}
	switching := func(to string) func(*fleet.Worker) { return func(x *fleet.Worker) { x.Switching = to } }
	for _, tc := range []struct {
		name    string
		workers []fleet.Worker
		queued  map[string]int
		want    string // "": none
	}{
		{"none can serve it", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.CanServe = []string{"b", "c"} })}, nil, ""},
		{"the only candidate", []fleet.Worker{w("w1", "b", 0)}, nil, "w1"},
		{"idle before busy", []fleet.Worker{w("w1", "b", 1), w("w2", "c", 0)}, nil, "w2"},
		{"idle before busy, whatever waits for it", []fleet.Worker{w("w1", "b", 3), w("w2", "c", 0)}, map[string]int{"c": 50}, "w2"},
		{"least queued for the model it holds", []fleet.Worker{w("w1", "b", 0), w("w2", "c", 0)}, map[string]int{"b": 3, "c": 1}, "w2"},
		{"then least running", []fleet.Worker{w("w1", "b", 5), w("w2", "c", 2)}, map[string]int{"b": 1, "c": 1}, "w2"},
		{"ties to the lowest id", []fleet.Worker{w("w2", "c", 0), w("w1", "b", 0), w("w3", "b", 0)}, nil, "w1"},
		{"the load estimate counts as running", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.Load = 2 }), w("w2", "c", 0)}, nil, "w2"},
		{"within its hold", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.LoadedAt = now.Add(-10 * time.Second).UnixMilli() })}, nil, ""},
		{"hold just over", []fleet.Worker{w("w1", "b", 0, func(x *fleet.Worker) { x.LoadedAt = now.Add(-30 * time.Second).UnixMilli() })}, nil, "w1"},
		{"one in its hold, one busy out of it", []fleet.Worker{
			w("w1", "b", 0, func(x *fleet.Worker) { x.LoadedAt = now.UnixMilli() }), w("w2", "c", 4)}, nil, "w2"},
		{"one switching to it already", []fleet.Worker{w("w1", "b", 0, switching("a")), w("w2", "c", 0)}, nil, ""},
		{"one switching elsewhere is no candidate", []fleet.Worker{w("w1", "b", 0, switching("c")), w("w2", "c", 2)}, nil, "w2"},
		{"draining, unhealthy: no candidates", []fleet.Worker{
			w("w1", "b", 0, func(x *fleet.Worker) { x.Draining = true }),
			w("w2", "c", 0, func(x *fleet.Worker) { x.Healthy = false })}, nil, ""},
		{"serving it already (unhealthy) is no candidate", []fleet.Worker{
			w("w1", "a", 0, func(x *fleet.Worker) { x.Healthy = false }), w("w2", "b", 1)}, nil, "w2"},
		{"demand of every model it serves", []fleet.Worker{
			w("w1", "b", 0, func(x *fleet.Worker) { x.Models = []string{"b", "b-lora"} }), w("w2", "c", 0)},
			map[string]int{"b": 1, "b-lora": 2, "c": 2}, "w2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queued := map[string]int{"a": 5}
			for m, n := range tc.queued {
				queued[m] = n
			}
			got, ok := chooseSwitch("a", tc.workers, queued, now)
			if ok != (tc.want != "") || got != tc.want {
				t.Fatalf("chose %q (%v), want %q", got, ok, tc.want)
			}
		})
	}
}

func TestSwitchAsksOneAtATime(t *testing.T) {
	var s switchAsks
	now := time.Now()
	if !s.begin("a", now) {
		t.Fatal("first ask refused")
	}
	if s.begin("a", now) {
		t.Fatal("a second ask for a while the first is in flight")
	}
	if !s.begin("b", now) {
		t.Fatal("an ask for another model refused")
	}
	s.end("a", time.Minute)
	if s.begin("a", time.Now().Add(30*time.Second)) {
		t.Fatal("asked again before the answer's wait ended")
	}
	if !s.begin("a", time.Now().Add(2*time.Minute)) {
		t.Fatal("not asked again after the wait")
	}
	// An ask never answered (end not called) frees the model in time.
	if !s.begin("b", now.Add(switchAskTimeout+switchSettle)) {
		t.Fatal("an unanswered ask held the model for good")
	}
}
