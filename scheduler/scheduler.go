package scheduler

import (
	"container/heap"
	"errors"
	"math"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Item is one queued request as the scheduler sees it.
type Item struct {
	Flow     string       // the tenant; "" is a flow like any other (requests with no tenant)
	Band     schemas.Band // strict priority between bands; 0 is schemas.BandDefault
	Weight   float64      // the flow's share in its band (> 0; 0 is 1): the latest item's weight is the flow's
	Priority int          // orders the flow's own items only: lower first, then arrival
	Cost     float64      // estimated engine time, in cost units (docs/scheduling.md); 0 is 1
	Expires  time.Time    // when it must leave the queue; zero: never
	Value    any          // the caller's

	enqueued time.Time
	seq      uint64
	idx      int // in its flow's heap; -1 when not queued
	f        *flow
}

// Enqueued is when Push took the item.
func (it *Item) Enqueued() time.Time { return it.enqueued }

// Queued reports whether the item is in a queue.
func (it *Item) Queued() bool { return it.f != nil && it.idx >= 0 }

// Config bounds a Queue. Zero values take the defaults shown.
type Config struct {
	MaxQueued  int           // items in all bands and flows; default 1024
	RateWindow time.Duration // the service rate's memory (Estimate); default 10s
}

// ErrFull is Push's refusal: the queue is full and the item's flow already
// holds at least its share of it.
var ErrFull = errors.New("scheduler: queue full")

// Queue is the scheduler of one model's queue: start-time fair queueing
// over flows within strict priority bands. It is not safe for concurrent
// use; time comes from the caller (no clock of its own).
type Queue struct {
	cfg      Config
	bands    [schemas.NumBands]band
	n        int
	seq      uint64
	meter    meter
	capacity float64 // SetCapacity's
}

// SetCapacity gives the rate (cost units per second) the workers can serve,
// as the caller estimates it from their slots and service times: Estimate
// uses it until the queue has been backlogged long enough to measure its
// own.
func (q *Queue) SetCapacity(rate float64) {
	if rate > 0 && !math.IsInf(rate, 0) {
		q.capacity = rate
	}
}

// band is one priority band: its flows, the backlogged ones in a heap by
// their virtual start tag, and the band's virtual time.
type band struct {
	flows   map[string]*flow
	active  flowHeap
	vtime   float64 // the start tag of the latest item served: a flow that becomes backlogged starts here
	n       int
	cost    float64 // queued cost
	weights float64 // sum of the backlogged flows' weights
}

// flow is one tenant in one band. tag is the virtual start of its next
// item: it grows by cost/weight with each item served, so flows that
// received less service (normalised by weight) go first.
type flow struct {
	name   string
	band   schemas.Band
	weight float64
	tag    float64
	items  itemHeap
	cost   float64 // queued cost
	hidx   int     // in band.active; -1 when not backlogged
}

// New makes an empty queue.
func New(cfg Config) *Queue {
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 1024
	}
	if cfg.RateWindow <= 0 {
		cfg.RateWindow = 10 * time.Second
	}
	q := &Queue{cfg: cfg, meter: meter{tau: cfg.RateWindow.Seconds()}}
	for i := range q.bands {
		q.bands[i].flows = map[string]*flow{}
	}
	return q
}

// Len is the number of queued items.
func (q *Queue) Len() int { return q.n }

func norm(it *Item) {
	if !(it.Weight > 0) || math.IsInf(it.Weight, 0) {
		it.Weight = 1
	}
	if !(it.Cost > 0) || math.IsInf(it.Cost, 0) {
		it.Cost = 1
	}
	if !it.Band.Valid() {
		it.Band = schemas.BandDefault
	}
}

// Push queues it at now. When the queue is full, the newest item of the flow
// that holds the most of it for its weight (in the lowest band that has
// items) makes room, and Push returns that item as evicted; if that would
// be it's own flow or a higher band's, Push refuses it with ErrFull.
func (q *Queue) Push(it *Item, now time.Time) (evicted *Item, err error) {
	norm(it)
	q.meter.advance(now, q.n > 0)
	if q.n >= q.cfg.MaxQueued {
		evicted = q.victim(it)
		if evicted == nil {
			return nil, ErrFull
		}
		q.Remove(evicted)
	}
	b := &q.bands[it.Band]
	f := b.flows[it.Flow]
	if f == nil {
		f = &flow{name: it.Flow, band: it.Band, weight: it.Weight, tag: b.vtime, hidx: -1}
		b.flows[it.Flow] = f
	}
	q.seq++
	it.seq, it.enqueued, it.f = q.seq, now, f
	heap.Push(&f.items, it)
	switch {
	case f.hidx < 0:
		f.weight = it.Weight
		f.tag = max(f.tag, b.vtime) // idle time earns no credit
		b.weights += f.weight
		heap.Push(&b.active, f)
	case f.weight != it.Weight || f.items[0] == it: // a new head can change the flow's tie-break
		b.weights += it.Weight - f.weight
		f.weight = it.Weight
		heap.Fix(&b.active, f.hidx)
	}
	f.cost += it.Cost
	b.n++
	b.cost += it.Cost
	q.n++
	return evicted, nil
}

// victim chooses the item that makes room for it in a full queue, or nil.
func (q *Queue) victim(it *Item) *Item {
	low := schemas.NumBands - 1
	for low > schemas.BandCritical && q.bands[low].n == 0 {
		low--
	}
	if low < it.Band {
		return nil
	}
	var worst *flow
	share := func(f *flow) float64 { return float64(f.items.Len()) / f.weight }
	for _, f := range q.bands[low].flows {
		if f.hidx >= 0 && (worst == nil || share(f) > share(worst)) {
			worst = f
		}
	}
	if worst == nil {
		return nil
	}
	if low == it.Band {
		mine := 1.0 / it.Weight
		if own := q.bands[low].flows[it.Flow]; own != nil {
			mine = float64(own.items.Len()+1) / it.Weight
		}
		if worst.name == it.Flow || share(worst) <= mine {
			return nil
		}
	}
	return worst.items.newest()
}

// Peek is the item that goes next: the head of the flow with the smallest
// start tag in the highest band that has items; nil when empty.
func (q *Queue) Peek() *Item {
	for i := range q.bands {
		if b := &q.bands[i]; b.n > 0 {
			return b.active[0].items[0]
		}
	}
	return nil
}

// Pop takes the item Peek returns out of the queue and charges its flow
// for it; nil when empty.
func (q *Queue) Pop(now time.Time) *Item {
	it := q.Peek()
	if it == nil {
		return nil
	}
	q.meter.advance(now, true)
	q.meter.served(it.Cost)
	f := it.f
	b := &q.bands[f.band]
	b.vtime = max(b.vtime, f.tag)
	f.tag += it.Cost / f.weight
	q.unqueue(it)
	return it
}

// Remove takes it out of the queue without charging its flow (a cancel, an
// expiry, an eviction). It does nothing for an item not queued.
func (q *Queue) Remove(it *Item) {
	if it.Queued() {
		q.unqueue(it)
	}
}

func (q *Queue) unqueue(it *Item) {
	f := it.f
	b := &q.bands[f.band]
	heap.Remove(&f.items, it.idx)
	f.cost -= it.Cost
	b.cost -= it.Cost
	b.n--
	q.n--
	if f.items.Len() == 0 {
		f.cost = 0 // no float drift carried into the next backlog
		b.weights -= f.weight
		heap.Remove(&b.active, f.hidx)
		if b.n == 0 {
			b.cost, b.weights = 0, 0
		}
	} else {
		heap.Fix(&b.active, f.hidx)
	}
}

// Settle corrects what flow was charged in band b by delta cost units: a
// request's real cost (known when it ends) minus its estimate. A refund
// never takes a flow's tag below the band's virtual time: no credit beyond
// the present.
func (q *Queue) Settle(name string, b schemas.Band, delta float64) {
	if !b.Valid() || delta == 0 || math.IsNaN(delta) || math.IsInf(delta, 0) {
		return
	}
	bs := &q.bands[b]
	f := bs.flows[name]
	if f == nil {
		if delta < 0 {
			return
		}
		f = &flow{name: name, band: b, weight: 1, tag: bs.vtime, hidx: -1}
		bs.flows[name] = f
	}
	f.tag = max(f.tag+delta/f.weight, bs.vtime)
	if f.hidx >= 0 {
		heap.Fix(&bs.active, f.hidx)
	}
}

// Expire removes the items whose Expires is before now, oldest first per
// flow, calling fn with each; and forgets idle flows whose tags the band's
// virtual time has passed (they are as good as new) or, past maxFlows idle
// ones, any.
func (q *Queue) Expire(now time.Time, fn func(*Item)) {
	q.meter.advance(now, q.n > 0)
	var out []*Item
	for i := range q.bands {
		b := &q.bands[i]
		for _, f := range b.flows {
			if f.hidx < 0 {
				if f.tag <= b.vtime || len(b.flows) > maxFlows(q.cfg.MaxQueued) {
					delete(b.flows, f.name)
				}
				continue
			}
			for _, it := range f.items {
				if !it.Expires.IsZero() && now.After(it.Expires) {
					out = append(out, it)
				}
			}
		}
	}
	for _, it := range out {
		q.unqueue(it)
		fn(it)
	}
}

// maxFlows bounds the idle flows a band remembers.
func maxFlows(maxQueued int) int { return 4*maxQueued + 1024 }

// Each calls fn for every backlogged flow: its band, name, items and
// queued cost (metrics; the console).
func (q *Queue) Each(fn func(b schemas.Band, flow string, n int, cost float64)) {
	for i := range q.bands {
		for _, f := range q.bands[i].active {
			fn(f.band, f.name, f.items.Len(), f.cost)
		}
	}
}

// Items calls fn for every queued item, in no particular order.
func (q *Queue) Items(fn func(*Item)) {
	for i := range q.bands {
		for _, f := range q.bands[i].active {
			for _, it := range f.items {
				fn(it)
			}
		}
	}
}

// Rate is the measured service rate: cost units served per second while
// the queue had items, over the last RateWindow; until that is known, the
// capacity SetCapacity gave; 0 when neither is.
func (q *Queue) Rate(now time.Time) float64 {
	q.meter.advance(now, q.n > 0)
	if r := q.meter.rate(); r > 0 {
		return r
	}
	return q.capacity
}

// Estimate says what a new item of flow in band b with weight and cost would
// wait if pushed now: the cost that would go before it (every item of higher
// bands; of its own band, its flow's queue and the other flows' service in
// proportion to their weights while its flow's is served, at most what they
// hold) over the measured rate, and how many items that is. ok is false
// while the rate is unknown.
func (q *Queue) Estimate(name string, b schemas.Band, weight, cost float64, now time.Time) (wait time.Duration, ahead int, ok bool) {
	it := Item{Weight: weight, Cost: cost, Band: b}
	norm(&it)
	weight, cost, b = it.Weight, it.Cost, it.Band
	var costAhead float64
	for i := range b {
		costAhead += q.bands[i].cost
		ahead += q.bands[i].n
	}
	bs := &q.bands[b]
	own, ownN, weights := 0.0, 0, bs.weights
	if f := bs.flows[name]; f != nil && f.hidx >= 0 {
		own, ownN = f.cost, f.items.Len()
	} else {
		weights += weight
	}
	if weights > 0 {
		// While the flow's own queue and this item are served, the band's
		// other flows get weights-weight for each weight of it.
		others := (own + cost) * (weights - weight) / weight
		costAhead += own + min(others, bs.cost-own)
		avg := 1.0
		if bs.n > 0 {
			avg = bs.cost / float64(bs.n)
		}
		ahead += ownN + min(int(others/avg), bs.n-ownN)
	}
	r := q.Rate(now)
	if r <= 0 {
		return 0, ahead, false
	}
	return time.Duration(costAhead / r * float64(time.Second)), ahead, true
}

// meter measures the service rate: cost served over time spent backlogged,
// both decayed exponentially with time constant tau seconds.
type meter struct {
	tau       float64
	last      time.Time
	cost, dur float64
}

func (m *meter) advance(now time.Time, backlogged bool) {
	if m.last.IsZero() || now.Before(m.last) {
		m.last = now
		return
	}
	dt := now.Sub(m.last).Seconds()
	m.last = now
	k := math.Exp(-dt / m.tau)
	m.cost *= k
	m.dur *= k
	if backlogged {
		m.dur += dt * (1 + k) / 2 // the interval's time, decayed by its midpoint
	}
}

func (m *meter) served(cost float64) { m.cost += cost }

// rate is 0 until the queue has been backlogged for a tenth of a second:
// one interval's cost over a sliver of time says nothing.
func (m *meter) rate() float64 {
	if m.dur < 0.1 {
		return 0
	}
	return m.cost / m.dur
}

// itemHeap orders a flow's items: lower Priority first, then arrival.
type itemHeap []*Item

func (h itemHeap) Len() int { return len(h) }
func (h itemHeap) Less(i, j int) bool {
	if h[i].Priority != h[j].Priority {
		return h[i].Priority < h[j].Priority
	}
	return h[i].seq < h[j].seq
}
func (h itemHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *itemHeap) Push(x any) {
	it := x.(*Item)
	it.idx = len(*h)
	*h = append(*h, it)
}
func (h *itemHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	it.idx = -1
	return it
}

// newest is the item that would go last: the largest Priority, then the
// latest arrival (a linear scan: only a full queue asks).
func (h itemHeap) newest() *Item {
	var w *Item
	for _, it := range h {
		if w == nil || it.Priority > w.Priority || (it.Priority == w.Priority && it.seq > w.seq) {
			w = it
		}
	}
	return w
}

// flowHeap orders a band's backlogged flows by start tag, then by their
// heads' arrival (of two flows level in service, the one waiting longer).
type flowHeap []*flow

func (h flowHeap) Len() int { return len(h) }
func (h flowHeap) Less(i, j int) bool {
	if h[i].tag != h[j].tag {
		return h[i].tag < h[j].tag
	}
	return h[i].items[0].seq < h[j].items[0].seq
}
func (h flowHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *flowHeap) Push(x any) {
	f := x.(*flow)
	f.hidx = len(*h)
	*h = append(*h, f)
}
func (h *flowHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	f.hidx = -1
	return f
}
