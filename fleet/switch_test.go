package fleet

import (
	"testing"
	"time"
)

// A worker switching models takes no new request, for its old models or
// any other, yet still counts as serving its old models (their requests
// wait for it); it counts as switching to its new one.
func TestSwitchingWorkerTakesNothing(t *testing.T) {
	now := time.Now()
	fl := New()
	sw := hb("s", 0, 10, "a")
	sw.CanServe, sw.Switching = []string{"a", "b"}, "b"
	fl.Observe(sw, now)
	if id, serving, ok := fl.Acquire("a", ""); ok || serving != 1 {
		t.Fatalf("acquire a: %q serving %d ok %v; want none, serving 1", id, serving, ok)
	}
	if _, _, _, ok := fl.AcquireAdapter("a-lora", "a", "", now); ok {
		t.Fatal("an adapter of its old model was routed to a switching worker")
	}
	if n := fl.SwitchingTo("b"); n != 1 {
		t.Fatalf("switching to b: %d", n)
	}
	if n := fl.Switchable("b"); n != 1 {
		t.Fatalf("switchable to b: %d", n)
	}
	// Its next heartbeat serves b: it takes requests again.
	sw.Models, sw.Switching, sw.Seq = []string{"b"}, "", sw.Seq+1
	fl.Observe(sw, now)
	if id, _, ok := fl.Acquire("b", ""); !ok || id != "s" {
		t.Fatalf("acquire b after the switch: %q %v", id, ok)
	}
	if fl.SwitchingTo("b") != 0 || fl.Switchable("b") != 0 || fl.Switchable("a") != 1 {
		t.Fatal("after the switch: switching or switchable counts wrong")
	}
}

// The fleet remembers the switches its heartbeats show: begun, ended, and
// one over between two beats.
func TestSwitchLog(t *testing.T) {
	now := time.Now()
	fl := New()
	beat := func(models []string, switching string, loadedAt int64) {
		h := hb("s", 0, 10, models...)
		h.CanServe, h.Switching, h.LoadedAt = []string{"a", "b"}, switching, loadedAt
		h.Seq = uint64(now.UnixNano())
		now = now.Add(time.Second)
		fl.Observe(h, now)
	}
	beat([]string{"a"}, "", 1)
	beat([]string{"a"}, "b", 1)
	if got := fl.Switches(); len(got) != 1 || got[0].From != "a" || got[0].To != "b" || got[0].Started.IsZero() || !got[0].Ended.IsZero() {
		t.Fatalf("begun: %+v", got)
	}
	beat([]string{"a"}, "b", 1) // still switching: the same switch
	beat([]string{"b"}, "", 2)
	got := fl.Switches()
	if len(got) != 1 || !got[0].OK || got[0].Ended.Sub(got[0].Started) != 2*time.Second {
		t.Fatalf("ended: %+v", got)
	}
	beat([]string{"a"}, "", 3) // back to a between two beats
	got = fl.Switches()
	if len(got) != 2 || got[0].From != "b" || got[0].To != "a" || !got[0].OK || !got[0].Started.IsZero() {
		t.Fatalf("newest first, one never seen switching: %+v", got)
	}
	beat([]string{"a"}, "b", 3)
	beat([]string{"a"}, "", 4) // failed: still a
	if got := fl.Switches(); got[0].OK || got[0].To != "b" {
		t.Fatalf("a failed switch: %+v", got[0])
	}
	for i := range 40 {
		beat([]string{[]string{"a", "b"}[i%2]}, "", int64(10+i))
	}
	if n := len(fl.Switches()); n != switchLogSize {
		t.Fatalf("%d switches kept", n)
	}
}
