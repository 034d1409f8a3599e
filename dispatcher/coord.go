package dispatcher

import (
	"encoding/json"
	"math"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

// Many dispatchers, one policy (docs/scheduling.md). Dispatchers that share
// workers (one embedded in each gateway, standalone ones) each schedule
// their own queue. While more than one of them has requests of a model
// queued, they divide the model's slots by weighted demand: each announces
// its backlogged flows (tenant, band, weight) on FlowsSubject every
// announcePeriod; each takes, of the highest band anyone has queued, a
// tenant's weight divided by the number of dispatchers holding that tenant,
// summed over the tenants it holds, as its demand; and lets at most its
// demand's share of the slots run at once. Its own queue then serves those
// tenants with their weights divided the same way, so that every tenant's
// share across all dispatchers is its weight's share. A dispatcher alone
// with a backlog has no limit: nothing changes for one dispatcher.

const (
	announcePeriod = 100 * time.Millisecond
	peerTTL        = 3*announcePeriod + 50*time.Millisecond // a peer silent this long has no backlog
	announceGap    = 10 * time.Millisecond                  // the least time between two announcements
	maxAnnounced   = 1000                                   // flows per model and band in one announcement
)

// flowKey names a flow of a model's queue.
type flowKey struct {
	model, tenant string
	band          schemas.Band
}

// coord is a dispatcher's share of the coordination, under Dispatcher.mu.
type coord struct {
	peers    map[string]peer     // by dispatcher id: their latest announcements
	weights  map[flowKey]float64 // our backlogged flows' weights, as their requests said
	split    map[flowKey]float64 // dispatchers holding each of our flows, us included, where more than one
	caps     map[string]int      // by model: requests we may have in flight while others are backlogged too
	inflight map[string]int      // by model: requests we forwarded that have not ended
	dirty    bool                // a flow joined our backlog since the last recompute
	lastPub  time.Time
	pubbed   bool // the last announcement had flows
}

type peer struct {
	at    time.Time
	flows map[flowKey]float64
}

func newCoord() coord {
	return coord{peers: map[string]peer{}, weights: map[flowKey]float64{}, split: map[flowKey]float64{},
		caps: map[string]int{}, inflight: map[string]int{}}
}

// onFlows takes another dispatcher's announcement.
func (d *Dispatcher) onFlows(m *nats.Msg) {
	var fd schemas.FlowDemand
	if err := json.Unmarshal(m.Data, &fd); err != nil || fd.Dispatcher == "" || fd.Dispatcher == d.cfg.ID {
		return
	}
	p := peer{at: time.Now(), flows: map[flowKey]float64{}}
	for model, bands := range fd.Models {
		for name, tenants := range bands {
			b, ok := schemas.ParseBand(name)
			if !ok {
				continue
			}
			for tenant, w := range tenants {
				if w > 0 && !math.IsInf(w, 0) {
					p.flows[flowKey{model, tenant, b}] = w
				}
			}
		}
	}
	d.mu.Lock()
	old := d.coord.peers[fd.Dispatcher]
	d.coord.peers[fd.Dispatcher] = p
	d.recomputeLocked(p.at)
	d.mu.Unlock()
	// Our limits changed: what we hold may go now.
	models := map[string]struct{}{}
	for k := range old.flows {
		models[k.model] = struct{}{}
	}
	for k := range p.flows {
		models[k.model] = struct{}{}
	}
	list := make([]string, 0, len(models))
	for m := range models {
		list = append(list, m)
	}
	d.drain(list)
}

// announceLocked publishes our backlogged flows, and once more when we have
// none left, at most every announceGap. force: even within announcePeriod.
func (d *Dispatcher) announceLocked(now time.Time, force bool) {
	c := &d.coord
	if now.Sub(c.lastPub) < announceGap || (!force && now.Sub(c.lastPub) < announcePeriod) {
		return
	}
	fd := schemas.FlowDemand{Dispatcher: d.cfg.ID, Models: map[string]map[string]map[string]float64{}}
	live := map[flowKey]bool{}
	for model, q := range d.queues {
		q.Each(func(b schemas.Band, tenant string, _ int, _ float64) {
			k := flowKey{model, tenant, b}
			live[k] = true
			bands := fd.Models[model]
			if bands == nil {
				bands = map[string]map[string]float64{}
				fd.Models[model] = bands
			}
			ts := bands[b.String()]
			if ts == nil {
				ts = map[string]float64{}
				bands[b.String()] = ts
			}
			if len(ts) < maxAnnounced {
				ts[tenant] = max(c.weights[k], 1)
			}
		})
	}
	for k := range c.weights {
		if !live[k] {
			delete(c.weights, k)
		}
	}
	if len(fd.Models) == 0 && !c.pubbed {
		return // nothing queued, and the others know
	}
	c.pubbed = len(fd.Models) > 0
	c.lastPub = now
	b, _ := json.Marshal(fd)
	_ = d.nc.Publish(schemas.FlowsSubject(d.cfg.ID), b)
}

// recomputeLocked sets, for every model some other dispatcher has queued
// requests of, how many of the model's slots we may use and by how many
// dispatchers each of our flows is divided.
func (d *Dispatcher) recomputeLocked(now time.Time) {
	c := &d.coord
	c.dirty = false
	clear(c.caps)
	clear(c.split)
	for id, p := range c.peers {
		if now.Sub(p.at) > peerTTL {
			delete(c.peers, id)
		}
	}
	if len(c.peers) == 0 {
		return
	}
	type demand struct {
		top     schemas.Band
		holders map[flowKey]int     // dispatchers holding each flow of the top band
		weight  map[string]float64  // by tenant, in the top band
		ours    map[flowKey]float64 // our flows of the top band
	}
	by := map[string]*demand{}
	get := func(model string) *demand {
		x := by[model]
		if x == nil {
			x = &demand{top: schemas.NumBands, holders: map[flowKey]int{}, weight: map[string]float64{}, ours: map[flowKey]float64{}}
			by[model] = x
		}
		return x
	}
	others := map[string]bool{} // models another dispatcher has a backlog of
	for _, p := range c.peers {
		for k := range p.flows {
			others[k.model] = true
			if x := get(k.model); k.band < x.top {
				x.top = k.band
			}
		}
	}
	if len(others) == 0 {
		return
	}
	for model, q := range d.queues {
		if !others[model] {
			continue
		}
		q.Each(func(b schemas.Band, tenant string, _ int, _ float64) {
			if x := get(model); b < x.top {
				x.top = b
			}
		})
	}
	count := func(k flowKey, w float64) {
		x := by[k.model]
		if x == nil || k.band != x.top {
			return
		}
		x.holders[k]++
		x.weight[k.tenant] = max(x.weight[k.tenant], w)
	}
	for _, p := range c.peers {
		for k, w := range p.flows {
			count(k, w)
		}
	}
	for model, q := range d.queues {
		if !others[model] {
			continue
		}
		q.Each(func(b schemas.Band, tenant string, _ int, _ float64) {
			k := flowKey{model, tenant, b}
			w := max(c.weights[k], 1)
			count(k, w)
			if x := by[model]; b == x.top {
				x.ours[k] = w
			}
		})
	}
	for model, x := range by {
		if !others[model] {
			continue
		}
		total := 0.0
		for _, w := range x.weight {
			total += w
		}
		mine := 0.0
		for k, w := range x.ours {
			n := float64(x.holders[k])
			mine += w / n
			if n > 1 {
				c.split[k] = n
			}
		}
		slots := d.slotsOf(model)
		if total <= 0 || slots == 0 {
			continue
		}
		limit := 0
		if mine > 0 {
			limit = max(int(math.Round(mine/total*float64(slots))), 1)
		}
		c.caps[model] = limit
	}
}

// slotsOf counts the slots of the live, healthy, non-draining workers of model.
func (d *Dispatcher) slotsOf(model string) int {
	n := 0
	for _, w := range d.fleet.Workers() {
		if !w.Healthy || w.Draining {
			continue
		}
		for _, m := range w.Models {
			if m == model {
				n += w.MaxConcurrency
				break
			}
		}
	}
	return n
}

// coordinatedLocked reports whether other dispatchers have requests of
// model queued: ours then queue too, to take their turn.
func (d *Dispatcher) coordinatedLocked(model string) bool {
	_, ok := d.coord.caps[model]
	return ok
}

// mayDispatchLocked reports whether we may send one more request of model
// to a worker: always, unless dispatchers share a backlog of it and we have
// our share in flight.
func (d *Dispatcher) mayDispatchLocked(model string, now time.Time) bool {
	if d.coord.dirty {
		d.recomputeLocked(now)
	}
	limit, ok := d.coord.caps[model]
	return !ok || d.coord.inflight[model] < limit
}

// flowWeightLocked notes a request's flow as it is queued and returns the
// weight its queue serves it with: its own, divided by the dispatchers that
// hold its tenant's requests too; fresh: the flow is new to our backlog
// (announce it once the request is queued).
func (d *Dispatcher) flowWeightLocked(model, tenant string, b schemas.Band, w float64) (weight float64, fresh bool) {
	c := &d.coord
	k := flowKey{model, tenant, b}
	if _, ok := c.weights[k]; !ok {
		fresh = true
		c.dirty = true
	}
	c.weights[k] = w
	if n := c.split[k]; n > 1 {
		return w / n, fresh
	}
	return w, fresh
}
