package fleet

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Two dispatchers (two fleets) see the same workers; one routes a prompt.
// Once the worker's KV events say it stored the prompt, the other routes
// there too; once they say it was evicted, neither does.
func TestKVEventsManyDispatchers(t *testing.T) {
	now := time.Now()
	P := prompt("p", 6)
	msg := func(ev schemas.KVEvents) []byte { b, _ := json.Marshal(ev); return b }
	d1, d2 := New(), New()
	for _, fl := range []*Fleet{d1, d2} {
		fl.Observe(hb("a", 0, 10, "m"), now)
		fl.Observe(hb("c", 1, 10, "m"), now)
	}
	if id, _, _, _ := d1.AcquirePrefix("m", "c", P); id != "a" {
		t.Fatal(id)
	}
	reset := func() {
		for _, fl := range []*Fleet{d1, d2} {
			fl.Observe(hb("a", 2, 10, "m"), now) // a is the busier one now
			fl.Observe(hb("c", 1, 10, "m"), now)
		}
	}
	reset()
	if d2.workers["a"].prefix.matched(P) != 0 {
		t.Fatal("d2 knows of P before any event")
	}
	// The events of a: P stored (and c's from d2's request, on c's subject).
	for _, fl := range []*Fleet{d1, d2} {
		if !fl.KVEvents(msg(schemas.KVEvents{Worker: "a", BlockBytes: 64, Seq: 1, Stored: [][]uint64{P}}), 64) {
			t.Fatal("event not applied")
		}
	}
	if id, _, cached, _ := d2.AcquirePrefix("m", "", append(P, 99)); id != "a" || cached != 6 {
		t.Fatalf("d2 after a's event: %s cached %d, want a with 6", id, cached)
	}
	reset()
	// a evicts P's 3rd block: d1's own record of P is corrected too.
	d1.KVEvents(msg(schemas.KVEvents{Worker: "a", BlockBytes: 64, Seq: 2, Removed: []uint64{P[2]}}), 64)
	if _, _, cached, _ := d1.AcquirePrefix("m", "a,c", P); cached != 0 {
		t.Fatal("acquired with everyone excluded")
	}
	d1.mu.RLock()
	got := d1.workers["a"].prefix.matched(P)
	d1.mu.RUnlock()
	if got != 2 {
		t.Fatalf("after the eviction a holds %d of P by d1's record, want 2", got)
	}

	// Ignored: another block size, an unknown worker, not JSON.
	for _, m := range [][]byte{
		msg(schemas.KVEvents{Worker: "a", BlockBytes: 128, Seq: 3, Removed: []uint64{P[0]}}),
		msg(schemas.KVEvents{Worker: "zz", BlockBytes: 64, Seq: 1, Stored: [][]uint64{P}}),
		[]byte("nope"),
	} {
		if d1.KVEvents(m, 64) {
			t.Fatalf("applied %s", m)
		}
	}
	// Lost events (a gap in seq, or dropped): the record is cleared.
	seq := uint64(1) // d2's last from a
	for _, tc := range []struct {
		gap     uint64
		dropped int
	}{{5, 0}, {1, 1}} {
		seq++
		d2.KVEvents(msg(schemas.KVEvents{Worker: "a", BlockBytes: 64, Seq: seq, Stored: [][]uint64{P}}), 64)
		seq += tc.gap
		d2.KVEvents(msg(schemas.KVEvents{Worker: "a", BlockBytes: 64, Seq: seq, Dropped: tc.dropped, Stored: [][]uint64{prompt("q", 2)}}), 64)
		d2.mu.RLock()
		p, q := d2.workers["a"].prefix.matched(P), d2.workers["a"].prefix.matched(prompt("q", 2))
		d2.mu.RUnlock()
		if p != 0 || q != 2 {
			t.Fatalf("gap %d dropped %d: P %d q %d, want the record cleared then q stored", tc.gap, tc.dropped, p, q)
		}
	}
}
