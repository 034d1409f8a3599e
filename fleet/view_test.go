package fleet

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestWorkersSortedWithLoad(t *testing.T) {
	t0 := time.Now()
	fl := New()
	for i, id := range []string{"w3", "w1", "w2"} {
		fl.Observe(hb(id, i, 10, "m"), t0.Add(time.Duration(i)*time.Millisecond))
	}
	fl.Acquire("m", "w2") // one more on the least loaded of w1 and w3: w3 (running 0)
	var ids []string
	for _, w := range fl.Workers() {
		ids = append(ids, w.Worker)
	}
	if !slices.Equal(ids, []string{"w1", "w2", "w3"}) {
		t.Fatalf("order %v", ids)
	}
	w := fl.Workers()
	if w[0].Load != 1 || w[1].Load != 2 || w[2].Load != 1 || w[2].Running != 0 {
		t.Fatalf("loads %d %d %d (w3 running %d), want 1 2 1 (0)", w[0].Load, w[1].Load, w[2].Load, w[2].Running)
	}
	if !w[0].LastSeen.Equal(t0.Add(time.Millisecond)) {
		t.Fatalf("w1 last seen %v", w[0].LastSeen)
	}
	// The admin API's rows: the heartbeat's fields inline, with load and last_seen.
	b, _ := json.Marshal(w[0])
	var row map[string]any
	if err := json.Unmarshal(b, &row); err != nil {
		t.Fatal(err)
	}
	if row["worker"] != "w1" || row["load"] != 1.0 || row["last_seen"] == nil || row["max_concurrency"] != 10.0 {
		t.Fatalf("row %s", b)
	}
	if New().Workers() == nil {
		t.Fatal("an empty fleet lists nil, not an empty list")
	}
}

func TestModelsServingLen(t *testing.T) {
	fl := New()
	now := time.Now()
	fl.Observe(hb("a", 0, 4, "m", "n"), now)
	fl.Observe(hb("b", 0, 4, "n", "o"), now)
	drain := hb("c", 1, 4, "p")
	drain.Draining = true
	fl.Observe(drain, now)
	sick := hb("d", 0, 4, "q")
	sick.Healthy = false
	fl.Observe(sick, now)
	if got := fl.Models(); !slices.Equal(got, []string{"m", "n", "o"}) {
		t.Fatalf("models %v: draining and unhealthy workers' models listed, or not deduplicated", got)
	}
	for model, want := range map[string]int{"m": 1, "n": 2, "p": 0, "q": 0, "x": 0} {
		if got := fl.Serving(model); got != want {
			t.Errorf("Serving(%s) = %d, want %d", model, got, want)
		}
	}
	if fl.Len() != 4 {
		t.Fatalf("len %d: draining and unhealthy workers are still live", fl.Len())
	}
	if got := fl.ModelsOf("b"); !slices.Equal(got, []string{"n", "o"}) {
		t.Fatalf("ModelsOf(b) = %v", got)
	}
}

func TestHeartbeatAndDoneMessages(t *testing.T) {
	fl := New()
	now := time.Now()
	msg := func(h schemas.Heartbeat) []byte { b, _ := json.Marshal(h); return b }
	tests := []struct {
		name         string
		data         []byte
		joined, ok   bool
		len, serving int
	}{
		{"not json", []byte("nope"), false, false, 0, 0},
		{"bad worker id", msg(hb("a.b", 0, 4, "m")), false, false, 0, 0},
		{"joins", msg(hb("a", 1, 4, "m")), true, true, 1, 1},
		{"beats again", msg(hb("a", 2, 4, "m")), false, true, 1, 1},
		{"draining but busy stays", msg(func() schemas.Heartbeat { h := hb("a", 1, 4, "m"); h.Draining = true; return h }()), false, true, 1, 0},
		{"draining and idle leaves", msg(func() schemas.Heartbeat { h := hb("a", 0, 4, "m"); h.Draining = true; return h }()), false, true, 0, 0},
	}
	for _, tt := range tests {
		_, joined, ok := fl.Heartbeat(tt.data, now)
		if joined != tt.joined || ok != tt.ok || fl.Len() != tt.len || fl.Serving("m") != tt.serving {
			t.Fatalf("%s: joined %v ok %v len %d serving %d; want %v %v %d %d", tt.name, joined, ok, fl.Len(), fl.Serving("m"),
				tt.joined, tt.ok, tt.len, tt.serving)
		}
	}

	fl.Observe(hb("w", 3, 4, "m"), now)
	if n, ok := fl.Done([]byte(`{"worker":"w","request_id":"r","running":1}`)); !ok || n.Worker != "w" {
		t.Fatalf("done notice: %+v %v", n, ok)
	}
	// One request left: the load drops by one, not to the worker's count,
	// which does not yet hold what we may have sent it since.
	if w := fl.Workers(); w[0].Load != 2 {
		t.Fatalf("load after a done notice %d, want 2", w[0].Load)
	}
	fl.Done([]byte(`{"worker":"w","request_id":"r2","running":1}`))
	if w := fl.Workers(); w[0].Load != 1 {
		t.Fatalf("load after a second done notice %d, want 1", w[0].Load)
	}
	// A higher count than ours (another dispatcher's requests) wins.
	fl.Done([]byte(`{"worker":"w","request_id":"r3","running":3}`))
	if w := fl.Workers(); w[0].Load != 3 {
		t.Fatalf("load after a done notice of 3 running %d, want 3", w[0].Load)
	}
	if _, ok := fl.Done([]byte(`nope`)); ok {
		t.Fatal("a bad done notice was applied")
	}
}
