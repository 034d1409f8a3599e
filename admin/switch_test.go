package admin_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// A worker of several models: the workers listing shows what it holds and
// can serve; a switch is asked of it; the switches its heartbeats show are
// listed.
func TestWorkerSwitch(t *testing.T) {
	w := newWorld(t)
	f := w.worker("w1", []string{"a"}, nil, false, false)
	beat := func(models []string, switching string, loadedAt int64) {
		beatSeq++
		b, _ := json.Marshal(schemas.Heartbeat{Worker: "w1", Models: models, CanServe: []string{"a", "b"}, Switching: switching,
			LoadedAt: loadedAt, HoldMS: 30000, MaxConcurrency: 8, Healthy: true, Engine: "sim", IntervalMS: 60000, Seq: beatSeq})
		if err := f.nc.Publish(schemas.HeartbeatSubject("w1"), b); err != nil {
			t.Fatal(err)
		}
		f.nc.Flush()
	}
	beat([]string{"a"}, "", 1000)
	var list struct {
		Data []struct {
			Worker    string   `json:"worker"`
			Models    []string `json:"models"`
			CanServe  []string `json:"can_serve"`
			Switching string   `json:"switching"`
			LoadedAt  int64    `json:"loaded_at"`
			HoldMS    int      `json:"hold_ms"`
		} `json:"data"`
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		w.do("GET", "/workers", "").expect(t, "workers", 200, "", "").decode(t, &list)
		if len(list.Data) != 1 || len(list.Data[0].CanServe) != 2 || list.Data[0].LoadedAt != 1000 || list.Data[0].HoldMS != 30000 {
			return fmt.Errorf("workers %+v", list)
		}
		return nil
	})

	var sw struct {
		Worker    string `json:"worker"`
		Switching string `json:"switching"`
	}
	w.do("POST", "/workers/w1/switch", `{"model":"b"}`).expect(t, "switch", 200, "", "").decode(t, &sw)
	if sw.Worker != "w1" || sw.Switching != "b" || len(f.asked()) != 1 || f.asked()[0] != schemas.CtlSwitch {
		t.Fatalf("switch %+v, asked %q", sw, f.asked())
	}
	w.do("POST", "/workers/nope/switch", `{"model":"b"}`).expect(t, "switch unknown worker", 404, "worker_not_found", "")
	w.do("POST", "/workers/w1/switch", `{"model":"b","x":1}`).expect(t, "switch with an unknown field", 400, "", "")

	beat([]string{"a"}, "b", 1000)
	beat([]string{"b"}, "", 2000)
	var switches struct {
		Object string `json:"object"`
		Data   []struct {
			Worker  string `json:"worker"`
			From    string `json:"from"`
			To      string `json:"to"`
			Started string `json:"started"`
			Ended   string `json:"ended"`
			OK      bool   `json:"ok"`
		} `json:"data"`
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		w.do("GET", "/workers/switches", "").expect(t, "switches", 200, "", "").decode(t, &switches)
		if len(switches.Data) != 1 || switches.Data[0].Ended == "" {
			return fmt.Errorf("switches %+v", switches)
		}
		return nil
	})
	if s := switches.Data[0]; s.Worker != "w1" || s.From != "a" || s.To != "b" || !s.OK || s.Started == "" || switches.Object != "list" {
		t.Fatalf("switch listed %+v", switches)
	}
}
