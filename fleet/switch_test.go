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
