package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

var t0 = time.Unix(1_800_000_000, 0)

func push(t testing.TB, q *Queue, it *Item) {
	t.Helper()
	if ev, err := q.Push(it, t0); err != nil || ev != nil {
		t.Fatalf("push %s: evicted %v, %v", it.Value, ev, err)
	}
}

func order(q *Queue) []string {
	var got []string
	for it := q.Pop(t0); it != nil; it = q.Pop(t0) {
		got = append(got, it.Value.(string))
	}
	return got
}

func TestOrder(t *testing.T) {
	I, C, B := schemas.BandInteractive, schemas.BandCritical, schemas.BandBatch
	type in struct {
		flow string
		band schemas.Band
		w    float64
		prio int
		cost float64
	}
	for _, tc := range []struct {
		name string
		in   []in
		want string
	}{
		{"one flow is first come first served", []in{{"a", I, 1, 0, 1}, {"a", I, 1, 0, 1}, {"a", I, 1, 0, 1}}, "a0 a1 a2"},
		{"bands are strict", []in{{"a", B, 1, 0, 1}, {"b", I, 1, 0, 1}, {"c", C, 1, 0, 1}, {"b", I, 1, 0, 1}}, "c2 b1 b3 a0"},
		{"flows take turns: a flood does not go first",
			[]in{{"a", I, 1, 0, 1}, {"a", I, 1, 0, 1}, {"a", I, 1, 0, 1}, {"a", I, 1, 0, 1}, {"b", I, 1, 0, 1}, {"b", I, 1, 0, 1}},
			"a0 b4 a1 b5 a2 a3"},
		{"weights: 2 to 1", []in{{"a", I, 2, 0, 1}, {"a", I, 2, 0, 1}, {"a", I, 2, 0, 1}, {"a", I, 2, 0, 1}, {"b", I, 1, 0, 1}, {"b", I, 1, 0, 1}},
			"a0 b4 a1 a2 b5 a3"},
		{"by cost, not by count: one long request is worth four short ones",
			[]in{{"long", I, 1, 0, 4}, {"long", I, 1, 0, 4}, {"short", I, 1, 0, 1}, {"short", I, 1, 0, 1}, {"short", I, 1, 0, 1}, {"short", I, 1, 0, 1}, {"short", I, 1, 0, 1}},
			"long0 short2 short3 short4 short5 long1 short6"},
		{"priority orders a flow's own requests only",
			[]in{{"a", I, 1, 0, 1}, {"a", I, 1, 0, 1}, {"b", I, 1, 5, 1}, {"b", I, 1, -100, 1}}, "a0 b3 a1 b2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := New(Config{})
			for i, x := range tc.in {
				name := x.flow + strconv.Itoa(i)
				push(t, q, &Item{Flow: x.flow, Band: x.band, Weight: x.w, Priority: x.prio, Cost: x.cost, Value: name})
			}
			got := fmt.Sprint(order(q))
			if want := "[" + tc.want + "]"; got != want {
				t.Errorf("order %s, want %s", got, want)
			}
		})
	}
}

// TestIdleEarnsNoCredit: a flow that was idle while another was served
// starts level with it, not with all the service it missed.
func TestIdleEarnsNoCredit(t *testing.T) {
	q := New(Config{})
	for i := range 100 {
		push(t, q, &Item{Flow: "a", Value: "a" + strconv.Itoa(i)})
		q.Pop(t0)
	}
	for i := range 3 {
		push(t, q, &Item{Flow: "a", Value: "a" + strconv.Itoa(100+i)})
	}
	push(t, q, &Item{Flow: "b", Value: "b0"})
	push(t, q, &Item{Flow: "b", Value: "b1"})
	push(t, q, &Item{Flow: "b", Value: "b2"})
	got := fmt.Sprint(order(q))
	// b starts at the band's virtual time, the start of a's latest service,
	// which a's next item is past: b first, then they alternate.
	if want := "[b0 a100 b1 a101 b2 a102]"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
}

func TestSettle(t *testing.T) {
	q := New(Config{})
	push(t, q, &Item{Flow: "a", Cost: 1, Value: "a0"})
	push(t, q, &Item{Flow: "b", Cost: 1, Value: "b1"})
	q.Pop(t0) // a0, estimated at 1, really cost 10
	q.Settle("a", schemas.BandInteractive, 9)
	for i := range 5 {
		push(t, q, &Item{Flow: "a", Cost: 1, Value: "a" + strconv.Itoa(2+i)})
		push(t, q, &Item{Flow: "b", Cost: 1, Value: "b" + strconv.Itoa(2+i)})
	}
	got := order(q)
	// b goes until it has caught up with a's 10: b1 plus b's five.
	if fmt.Sprint(got[:6]) != "[b1 b2 b3 b4 b5 b6]" {
		t.Errorf("after a's overrun: %v", got)
	}
	// A refund takes no flow below the present.
	q.Settle("a", schemas.BandInteractive, -1e9)
	push(t, q, &Item{Flow: "c", Value: "c0"})
	push(t, q, &Item{Flow: "a", Value: "a9"})
	if got := fmt.Sprint(order(q)); got != "[c0 a9]" {
		t.Errorf("after a refund: %v", got)
	}
}

func TestFullQueueEvictsTheBiggestFlow(t *testing.T) {
	q := New(Config{MaxQueued: 4})
	for i := range 4 {
		push(t, q, &Item{Flow: "flood", Band: schemas.BandInteractive, Value: "f" + strconv.Itoa(i)})
	}
	// Another tenant gets in: the flood's newest makes room.
	ev, err := q.Push(&Item{Flow: "quiet", Value: "q0"}, t0)
	if err != nil || ev == nil || ev.Value != "f3" || ev.Queued() {
		t.Fatalf("quiet push: evicted %v, %v", ev, err)
	}
	// The flood itself does not: it already holds the most.
	if ev, err := q.Push(&Item{Flow: "flood", Value: "f4"}, t0); err != ErrFull || ev != nil {
		t.Fatalf("flood push: evicted %v, %v", ev, err)
	}
	// A batch request does not push out an interactive one...
	if _, err := q.Push(&Item{Flow: "other", Band: schemas.BandBatch, Value: "b"}, t0); err != ErrFull {
		t.Fatalf("batch push into a full interactive queue: %v", err)
	}
	// ...but a critical one pushes out the lowest band's.
	ev, err = q.Push(&Item{Flow: "ops", Band: schemas.BandCritical, Value: "c0"}, t0)
	if err != nil || ev == nil || ev.Value != "f2" {
		t.Fatalf("critical push: evicted %v, %v", ev, err)
	}
	if got := fmt.Sprint(order(q)); got != "[c0 f0 q0 f1]" {
		t.Errorf("order %s", got)
	}
}

func TestExpire(t *testing.T) {
	q := New(Config{})
	push(t, q, &Item{Flow: "a", Expires: t0.Add(time.Second), Value: "a0"})
	push(t, q, &Item{Flow: "a", Value: "a1"})
	push(t, q, &Item{Flow: "b", Expires: t0.Add(3 * time.Second), Value: "b0"})
	var gone []string
	q.Expire(t0.Add(2*time.Second), func(it *Item) { gone = append(gone, it.Value.(string)) })
	if fmt.Sprint(gone) != "[a0]" || q.Len() != 2 {
		t.Fatalf("expired %v, %d left", gone, q.Len())
	}
	if got := fmt.Sprint(order(q)); got != "[a1 b0]" {
		t.Errorf("order %s", got)
	}
}

// TestEstimate: with a known rate, the wait is the cost that goes first
// over the rate, counting the other flows' share while this one's is served.
func TestEstimate(t *testing.T) {
	q := New(Config{RateWindow: time.Hour})
	now := t0
	if _, _, ok := q.Estimate("x", schemas.BandInteractive, 1, 1, now); ok {
		t.Fatal("an estimate before any service")
	}
	// Serve 10 cost units per second for 10 s, backlogged throughout.
	for i := range 100 {
		_, _ = q.Push(&Item{Flow: "a", Cost: 1, Value: i}, now)
		_, _ = q.Push(&Item{Flow: "a", Cost: 1, Value: i}, now)
		now = now.Add(100 * time.Millisecond)
		q.Pop(now)
	}
	if r := q.Rate(now); math.Abs(r-10) > 0.5 {
		t.Fatalf("rate %.2f, want 10", r)
	}
	// a has 100 queued (cost 100); a new flow b of equal weight with a
	// request of cost 1 waits for one of a's: 1 unit, 0.1 s.
	wait, ahead, ok := q.Estimate("b", schemas.BandInteractive, 1, 1, now)
	if !ok || ahead != 1 || math.Abs(wait.Seconds()-0.1) > 0.02 {
		t.Errorf("b: %v, %d ahead, %v", wait, ahead, ok)
	}
	// a itself waits for its whole queue.
	wait, ahead, _ = q.Estimate("a", schemas.BandInteractive, 1, 1, now)
	if ahead != 100 || math.Abs(wait.Seconds()-10) > 0.5 {
		t.Errorf("a: %v, %d ahead", wait, ahead)
	}
	// A critical request waits for nothing; a batch one for everything.
	if wait, ahead, _ = q.Estimate("c", schemas.BandCritical, 1, 1, now); ahead != 0 || wait != 0 {
		t.Errorf("critical: %v, %d ahead", wait, ahead)
	}
	if _, ahead, _ = q.Estimate("c", schemas.BandBatch, 1, 1, now); ahead != 100 {
		t.Errorf("batch: %d ahead", ahead)
	}
}

// TestWeightedShares runs saturating flows of unequal weights and request
// costs through the queue and checks the cost each was served.
func TestWeightedShares(t *testing.T) {
	for _, tc := range []struct {
		name          string
		weights       []float64
		costs         []float64 // each flow's request cost
		settle        []float64 // real cost / estimate
		wantShareOf0  float64
		withinPercent float64
	}{
		{"3:1, equal costs", []float64{3, 1}, []float64{1, 1}, []float64{1, 1}, 0.75, 1},
		{"3:1, long prompts against short", []float64{3, 1}, []float64{1, 20}, []float64{1, 1}, 0.75, 1},
		{"3:1, the light flow's estimates four times too low", []float64{3, 1}, []float64{5, 5}, []float64{1, 4}, 0.75, 2},
		{"1:1:1:1, one of four", []float64{1, 1, 1, 1}, []float64{1, 2, 3, 4}, []float64{1, 1, 1, 1}, 0.25, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := New(Config{MaxQueued: 1 << 16})
			served := make([]float64, len(tc.weights))
			refill := func(i int) {
				_, _ = q.Push(&Item{Flow: strconv.Itoa(i), Weight: tc.weights[i], Cost: tc.costs[i], Value: i}, t0)
			}
			for i := range tc.weights {
				for range 4 {
					refill(i)
				}
			}
			for range 20000 {
				it := q.Pop(t0)
				i := it.Value.(int)
				real := it.Cost * tc.settle[i]
				q.Settle(it.Flow, it.Band, real-it.Cost)
				served[i] += real
				refill(i)
			}
			total := 0.0
			for _, s := range served {
				total += s
			}
			if got := served[0] / total; math.Abs(got-tc.wantShareOf0)*100 > tc.withinPercent {
				t.Errorf("flow 0 got %.3f of the service, want %.3f", got, tc.wantShareOf0)
			}
		})
	}
}

// FuzzInvariants drives a queue with random operations and checks after each
// Pop: the bands are strict, the items' flows stay in order (priority, then
// arrival), counts agree; and at the end that no flow starves.
func FuzzInvariants(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte("a flood of one tenant and a trickle of another, with a critical one"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		q := New(Config{MaxQueued: 32})
		now := t0
		queued := map[*Item]bool{}
		for i, op := range ops {
			now = now.Add(time.Duration(op) * time.Millisecond)
			switch op % 4 {
			case 0, 1: // push
				it := &Item{Flow: string('a' + rune(op%5)), Band: schemas.Band(op/4%3 + 1), Weight: float64(op%3 + 1),
					Priority: int(op%7) - 3, Cost: float64(op%11 + 1), Value: i}
				if op%13 == 0 {
					it.Expires = now.Add(5 * time.Millisecond)
				}
				ev, err := q.Push(it, now)
				if err == nil {
					queued[it] = true
				}
				if ev != nil {
					if !queued[ev] || ev.Queued() || ev.Band < it.Band {
						t.Fatalf("bad eviction %+v for %+v", ev, it)
					}
					delete(queued, ev)
				}
			case 2: // pop
				it := q.Pop(now)
				if it == nil {
					if len(queued) != 0 {
						t.Fatalf("Pop nil with %d queued", len(queued))
					}
					continue
				}
				if !queued[it] {
					t.Fatalf("popped an item not queued")
				}
				delete(queued, it)
				for o := range queued {
					if o.Band < it.Band {
						t.Fatalf("popped band %v before %v", it.Band, o.Band)
					}
					if o.Flow == it.Flow && o.Band == it.Band && (o.Priority < it.Priority || o.Priority == it.Priority && o.seq < it.seq) {
						t.Fatalf("flow %q out of order", it.Flow)
					}
				}
				q.Settle(it.Flow, it.Band, float64(op%5)-2)
			case 3: // expire
				q.Expire(now, func(it *Item) {
					if !queued[it] || !now.After(it.Expires) {
						t.Fatalf("expired %+v at %v", it, now)
					}
					delete(queued, it)
				})
			}
			if q.Len() != len(queued) {
				t.Fatalf("Len %d, %d queued", q.Len(), len(queued))
			}
		}
		// No starvation: everything left comes out, in at most Len pops.
		for n := q.Len(); n > 0; n-- {
			if q.Pop(now) == nil {
				t.Fatal("Pop nil with items queued")
			}
		}
		if q.Len() != 0 || q.Peek() != nil {
			t.Fatal("items left")
		}
	})
}

// TestNoStarvation: a flow with a tiny weight under a heavy flow of a huge
// weight is still served, at its share.
func TestNoStarvation(t *testing.T) {
	q := New(Config{MaxQueued: 1 << 12})
	_, _ = q.Push(&Item{Flow: "small", Weight: 1, Value: "s"}, t0)
	for i := range 2000 {
		_, _ = q.Push(&Item{Flow: "big", Weight: 1000, Value: i}, t0)
	}
	for i := range 1002 {
		if q.Pop(t0).Flow == "small" {
			return
		}
		_ = i
	}
	t.Fatal("the small flow was not served within its share (1 in 1001)")
}

// BenchmarkDecision: one request's way through a queue holding 10,000
// requests of 1,000 tenants: Push, then the Pop of a free slot.
func BenchmarkDecision(b *testing.B) {
	q := New(Config{MaxQueued: 20000})
	rng := rand.New(rand.NewPCG(1, 2))
	flows := make([]string, 1000)
	for i := range flows {
		flows[i] = "tenant-" + strconv.Itoa(i)
	}
	mk := func() *Item {
		return &Item{Flow: flows[rng.IntN(len(flows))], Band: schemas.Band(1 + rng.IntN(3)), Weight: float64(1 + rng.IntN(4)),
			Cost: float64(1 + rng.IntN(500))}
	}
	for range 10000 {
		_, _ = q.Push(mk(), t0)
	}
	next := mk()
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		now = now.Add(time.Microsecond)
		if _, err := q.Push(next, now); err != nil {
			b.Fatal(err)
		}
		out := q.Pop(now)
		q.Settle(out.Flow, out.Band, 1)
		*out = Item{Flow: out.Flow, Band: out.Band, Weight: out.Weight, Cost: out.Cost} // reused: no allocation measured
		next = out
	}
}

// BenchmarkEstimate: the wait estimate a request gets on arrival.
func BenchmarkEstimate(b *testing.B) {
	q := New(Config{MaxQueued: 20000})
	now := t0
	for i := range 10000 {
		now = now.Add(time.Millisecond)
		_, _ = q.Push(&Item{Flow: "tenant-" + strconv.Itoa(i%1000), Cost: 10}, now)
		if i%2 == 0 {
			q.Pop(now)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_, _, _ = q.Estimate("tenant-"+strconv.Itoa(i%1000), schemas.BandInteractive, 1, 10, now)
	}
}
