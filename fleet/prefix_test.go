package fleet

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// order lists a record's hashes, most recent first.
func (l *prefixLRU) order() []uint64 {
	var out []uint64
	for n := l.head; n >= 0; n = l.next[n] {
		out = append(out, l.keys[n])
	}
	return out
}

func TestPrefixLRU(t *testing.T) {
	l := newPrefixLRU(4)
	l.record([]uint64{1, 2, 3})
	if got := l.order(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("order %v: a prompt's head must be the most recent, its tail evicted first", got)
	}
	l.record([]uint64{1, 5, 6}) // 3 and 2 are the least recent: 3 goes
	if got := l.order(); !slices.Equal(got, []uint64{1, 5, 6, 2}) {
		t.Fatalf("order %v", got)
	}
	if got := l.matched([]uint64{1, 2, 3}); got != 2 {
		t.Fatalf("matched %d, want 2 (3 was evicted)", got)
	}
	if got := l.matched([]uint64{1, 5, 6, 7}); got != 3 {
		t.Fatalf("matched %d, want 3", got)
	}
	if got := l.matched([]uint64{9, 1}); got != 0 {
		t.Fatalf("matched %d: a chained hash counts only after all its parents", got)
	}
	l.drop(5)
	l.drop(42) // not held: nothing
	if got := l.order(); !slices.Equal(got, []uint64{1, 6, 2}) || l.len() != 3 {
		t.Fatalf("after drop: %v (len %d)", got, l.len())
	}
	l.record([]uint64{7, 8})
	if got := l.order(); !slices.Equal(got, []uint64{7, 8, 1, 6}) {
		t.Fatalf("after refill: %v", got)
	}
	l.resize(2)
	if got := l.order(); !slices.Equal(got, []uint64{7, 8}) || l.len() != 2 {
		t.Fatalf("after resize: %v", got)
	}
	var nilLRU *prefixLRU
	if nilLRU.matched([]uint64{1}) != 0 {
		t.Fatal("an empty record holds something")
	}
}

// prompt is n chained block hashes of a prompt named p.
func prompt(p string, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(len(p))<<32 | uint64(p[0])<<16 | uint64(i+1)
	}
	return out
}

func TestAcquirePrefixScoring(t *testing.T) {
	P, Q := prompt("p", 8), prompt("q", 8)
	type routed struct {
		worker string
		hashes []uint64
	}
	tests := []struct {
		name    string
		beats   []schemas.Heartbeat
		before  []routed // earlier decisions of this fleet: worker forced by excluding the others
		hashes  []uint64
		exclude string
		want    string
		cached  int
	}{
		{"cold prompt: least loaded",
			[]schemas.Heartbeat{hb("a", 3, 10, "m"), hb("c", 1, 10, "m")}, nil, P, "", "c", 0},
		{"holder beats an idle worker",
			[]schemas.Heartbeat{hb("a", 3, 10, "m"), hb("c", 0, 10, "m")}, []routed{{"a", P}}, P, "", "a", 8},
		{"another prompt is not a hit",
			[]schemas.Heartbeat{hb("a", 3, 10, "m"), hb("c", 0, 10, "m")}, []routed{{"a", P}}, Q, "", "c", 0},
		{"a shared head counts its share",
			[]schemas.Heartbeat{hb("a", 3, 10, "m"), hb("c", 0, 10, "m")}, []routed{{"a", P[:6]}}, P, "", "a", 6},
		{"half cached on a much busier worker: the idle one",
			[]schemas.Heartbeat{hb("a", 7, 10, "m"), hb("c", 0, 10, "m")}, []routed{{"a", P[:4]}}, P, "", "c", 0},
		{"full holder: elsewhere",
			[]schemas.Heartbeat{hb("a", 10, 10, "m"), hb("c", 5, 10, "m")}, []routed{{"a", P}}, P, "", "c", 0},
		{"excluded holder: elsewhere",
			[]schemas.Heartbeat{hb("a", 0, 10, "m"), hb("c", 5, 10, "m")}, []routed{{"a", P}}, P, "a", "c", 0},
		{"two holders: the less loaded",
			[]schemas.Heartbeat{hb("a", 4, 10, "m"), hb("c", 2, 10, "m"), hb("d", 0, 10, "m")},
			[]routed{{"a", P}, {"c", P}}, P, "", "c", 8},
		{"the longer hit wins at equal load",
			[]schemas.Heartbeat{hb("a", 2, 10, "m"), hb("c", 2, 10, "m")}, []routed{{"a", P[:3]}, {"c", P[:5]}}, P, "", "c", 5},
		{"waiting counts against a holder",
			[]schemas.Heartbeat{func() schemas.Heartbeat { h := hb("a", 5, 10, "m"); h.Waiting = 6; return h }(), hb("c", 0, 10, "m")},
			[]routed{{"a", P}}, P, "", "c", 0},
		{"a full KV cache counts against a holder",
			[]schemas.Heartbeat{func() schemas.Heartbeat { h := hb("a", 1, 10, "m"); h.KVCacheUsage = 1; return h }(), hb("c", 0, 10, "m")},
			[]routed{{"a", P[:2]}}, P, "", "c", 0},
		{"draining holder skipped",
			[]schemas.Heartbeat{func() schemas.Heartbeat { h := hb("a", 1, 10, "m"); h.Draining = true; return h }(), hb("c", 4, 10, "m")},
			[]routed{{"a", P}}, P, "", "c", 0},
		{"holder of another model is no candidate",
			[]schemas.Heartbeat{hb("a", 0, 10, "x", "m"), hb("c", 4, 10, "m")}, []routed{{"a", P}}, P, "c", "a", 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Now()
			fl := New()
			for _, h := range tt.beats { // idle and routable for the setup
				h.Running, h.Waiting, h.KVCacheUsage, h.Draining = 0, 0, 0, false
				fl.Observe(h, now)
			}
			for _, r := range tt.before {
				var others []string
				for _, h := range tt.beats {
					if h.Worker != r.worker {
						others = append(others, h.Worker)
					}
				}
				if got, _, _, ok := fl.AcquirePrefix("m", strings.Join(others, ","), r.hashes); !ok || got != r.worker {
					t.Fatalf("setup: routed to %q (%v), want %s", got, ok, r.worker)
				}
			}
			for _, h := range tt.beats { // the state under test
				fl.Observe(h, now)
			}
			id, _, cached, ok := fl.AcquirePrefix("m", tt.exclude, tt.hashes)
			if !ok || id != tt.want || cached != tt.cached {
				t.Fatalf("AcquirePrefix = %q cached %d (%v), want %q cached %d", id, cached, ok, tt.want, tt.cached)
			}
		})
	}
}

// A conversation sticks to its worker; equal cold prompts spread; ties
// between equal holders rotate.
func TestAcquirePrefixAffinityAndTies(t *testing.T) {
	now := time.Now()
	fl := New()
	fl.Observe(hb("a", 0, 100, "m"), now)
	fl.Observe(hb("c", 0, 100, "m"), now)
	first, _, _, _ := fl.AcquirePrefix("m", "", prompt("p", 4))
	for turn := 2; turn <= 6; turn++ { // each turn's prompt extends the last
		id, _, cached, _ := fl.AcquirePrefix("m", "", append(prompt("p", 4), prompt("t", turn)...))
		if id != first || cached < 4 {
			t.Fatalf("turn %d went to %s with %d cached, want %s", turn, id, cached, first)
		}
	}
	// Cold prompts at equal load: both workers get some.
	fl = New()
	fl.Observe(hb("a", 0, 100, "m"), now)
	fl.Observe(hb("c", 0, 100, "m"), now)
	got := map[string]int{}
	for i := range 8 {
		id, _, _, _ := fl.AcquirePrefix("m", "", prompt(string(rune('A'+i)), 3))
		got[id]++
		fl.Finished(id, 0)
	}
	if got["a"] == 0 || got["c"] == 0 {
		t.Fatalf("cold prompts at equal load all went to one worker: %v", got)
	}
}

// The record of a worker is bounded: an old prefix falls out of it, and its
// size follows the heartbeat's kv_cache_tokens.
func TestAcquirePrefixEvicted(t *testing.T) {
	now := time.Now()
	fl := New()
	a := hb("a", 0, 10, "m")
	a.KVCacheTokens = 8 * 16 // 8 blocks of 16 tokens
	fl.Observe(a, now)
	fl.Observe(hb("c", 1, 10, "m"), now)
	P, Q := prompt("p", 6), prompt("q", 8)
	if id, _, _, _ := fl.AcquirePrefix("m", "c", P); id != "a" {
		t.Fatal(id)
	}
	if id, _, _, _ := fl.AcquirePrefix("m", "c", Q); id != "a" { // pushes P out
		t.Fatal(id)
	}
	a.Running = 2
	fl.Observe(a, now)
	if id, _, cached, _ := fl.AcquirePrefix("m", "", P); id != "c" || cached != 0 {
		t.Fatalf("evicted prefix went to %s (cached %d), want the less loaded c", id, cached)
	}
	fl.Observe(a, now)
	if id, _, cached, _ := fl.AcquirePrefix("m", "", Q); id != "a" || cached != 8 {
		t.Fatalf("recent prefix went to %s (cached %d)", id, cached)
	}
}

// A worker that stops beating is forgotten with its record: when it comes
// back (restarted, its cache empty) it holds nothing.
func TestAcquirePrefixStaleWorker(t *testing.T) {
	t0 := time.Now()
	fl := New()
	fl.Observe(hb("a", 0, 10, "m"), t0)
	fl.Observe(hb("c", 1, 10, "m"), t0)
	P := prompt("p", 4)
	if id, _, _, _ := fl.AcquirePrefix("m", "c", P); id != "a" {
		t.Fatal(id)
	}
	later := t0.Add(2 * time.Second)
	fl.Observe(hb("c", 1, 10, "m"), later)
	fl.Observe(hb("a", 0, 10, "m"), later) // still beating: still a holder
	if id, _, cached, _ := fl.AcquirePrefix("m", "", P); id != "a" || cached != 4 {
		t.Fatalf("live holder: %s cached %d", id, cached)
	}
	gone := t0.Add(6 * time.Second)
	fl.Observe(hb("c", 1, 10, "m"), gone)
	if g := fl.Expire(gone); !slices.Equal(g, []string{"a"}) {
		t.Fatalf("expired %v", g)
	}
	fl.Observe(hb("a", 2, 10, "m"), gone) // back, busier than c
	if id, _, cached, _ := fl.AcquirePrefix("m", "", P); id != "c" || cached != 0 {
		t.Fatalf("after a's restart: %s cached %d, want c by load", id, cached)
	}
}

// Adapters: within the holders, the one with the prompt cached wins; the
// adapter's blocks are recorded on the worker chosen.
func TestAcquireAdapterPrefix(t *testing.T) {
	now := time.Now()
	fl := New()
	fl.Observe(lw{"a", 1, 10, 4, []string{"x"}, nil}.beat(), now)
	fl.Observe(lw{"c", 3, 10, 4, []string{"x"}, nil}.beat(), now)
	P := prompt("p", 5)
	if id, _, _, _, _ := fl.AcquireAdapterPrefix("x", "b", "a", P, now); id != "c" {
		t.Fatal(id)
	}
	fl.Observe(lw{"c", 3, 10, 4, []string{"x"}, nil}.beat(), now)
	id, _, how, cached, ok := fl.AcquireAdapterPrefix("x", "b", "", P, now)
	if !ok || id != "c" || how != PlacedHolder || cached != 5 {
		t.Fatalf("got %s %v cached %d, want the holder with the prompt cached", id, how, cached)
	}
	if id, _, _, _, _ := fl.AcquireAdapterPrefix("x", "b", "", prompt("q", 5), now); id != "a" {
		t.Fatalf("a cold prompt went to %s, want the less loaded holder", id)
	}
}

// BenchmarkAcquirePrefix is one prefix-aware routing decision over 64
// workers for a prompt of 80 blocks (about 1300 tokens) half of whose
// prefixes have been seen.
func BenchmarkAcquirePrefix(b *testing.B) {
	fl := New()
	now := time.Now()
	for i := range 64 {
		fl.Observe(hb(fmt.Sprintf("w%02d", i), i%7, 1<<30, "m"), now)
	}
	prompts := make([][]uint64, 32)
	for i := range prompts {
		prompts[i] = make([]uint64, 80)
		for j := range prompts[i] {
			prompts[i][j] = uint64(i)<<32 | uint64(j+1)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, _, ok := fl.AcquirePrefix("m", "", prompts[i%len(prompts)]); !ok {
			b.Fatal("no worker")
		}
		i++
	}
}
