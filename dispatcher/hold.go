package dispatcher

import (
	"cmp"
	"encoding/json"
	"slices"
	"time"

	"github.com/tokenbus/tokenbus/scheduler"
	"github.com/tokenbus/tokenbus/schemas"
)

// Hold for capacity (docs/capacity.md). A request for a model that no live
// worker serves is not refused when the model exists: registered in the
// registry, or a live worker can switch to it. It waits in the model's
// queue, in flow control's order like any queued request, for up to
// ColdStartTimeout (never past its deadline), while an autoscaler starts a
// worker (it sees the queue gauge and the demand events), a sleeping one
// wakes or a shared one switches. A model nobody registered stays a 404.
//
// Every queued request, held or not, gets its queued frame again every
// HoldBeat: its client then notices within a few beats that the
// dispatcher holding it died (and sends it again) instead of waiting out
// its whole queue limit, minutes for a cold start.

// holdable reports whether a request for model (an adapter: ad) may wait
// for capacity that is not up: the model is registered or a live worker
// can switch to it (an adapter: its base model is).
func (d *Dispatcher) holdable(model string, ad *adapterRef) bool {
	if ad != nil { // a registered adapter: held when its base model may come up
		model = ad.base
	}
	return d.models != nil && d.models.Known(model) || d.fleet.Switchable(model) > 0
}

// serving counts the live workers that can take a request for model now or
// after loading it (an adapter: the workers of its base).
func (d *Dispatcher) serving(model string, ad *adapterRef) int {
	if ad != nil {
		return d.fleet.ServingAdapter(model, ad.base)
	}
	return d.fleet.Serving(model)
}

// holdState is a model with requests held for capacity here.
type holdState struct {
	since     time.Time   // the first request held
	announced time.Time   // the last demand event
	adapter   *adapterRef // the model is this adapter (nil: a base model)
}

// heldLocked notes that a request for model is held for capacity; the
// first one publishes the model's demand event at once (the sweep repeats
// it every HoldBeat).
func (d *Dispatcher) heldLocked(model string, ad *adapterRef, now time.Time) {
	if d.held[model] != nil {
		return
	}
	d.held[model] = &holdState{since: now, adapter: ad}
	d.m.coldStarts.WithLabelValues("started").Inc()
	d.log.Info("holding requests for capacity: no live worker serves the model", "model", model)
	q := d.queues[model]
	d.demandLocked(model, q, now)
}

// demandLocked publishes model's demand event (schemas.Demand).
func (d *Dispatcher) demandLocked(model string, q *scheduler.Queue, now time.Time) {
	h := d.held[model]
	ev := schemas.Demand{Model: model, Dispatcher: d.cfg.ID, Switchable: d.fleet.Switchable(model), Sleeping: d.fleet.Asleep(model)}
	if q != nil {
		ev.Waiting = q.Len()
		q.Items(func(it *scheduler.Item) {
			ev.OldestMS = max(ev.OldestMS, now.Sub(it.Enqueued()).Milliseconds())
		})
	}
	if h != nil {
		h.announced = now
	}
	b, _ := json.Marshal(ev)
	_ = d.nc.Publish(schemas.DemandSubject(model), b)
}

// holdSweepLocked runs on every sweep: it announces the demand of the
// models held for, and ends the holds that capacity came for (or whose
// requests all left). It returns the queued frames due again (beat).
func (d *Dispatcher) holdSweepLocked(now time.Time) []beat {
	for model, h := range d.held {
		q := d.queues[model]
		waiting := q != nil && q.Len() > 0
		if waiting && d.coldQueueLocked(model, q) {
			if now.Sub(h.announced) >= d.cfg.HoldBeat {
				d.demandLocked(model, q, now)
			}
			continue
		}
		outcome := "served"
		if !waiting && d.serving(model, h.adapter) == 0 {
			outcome = "gave_up" // timed out, cancelled or refused before capacity came
		}
		d.m.coldStarts.WithLabelValues(outcome).Inc()
		if outcome == "served" {
			d.m.coldStartSeconds.Observe(now.Sub(h.since).Seconds())
		}
		d.log.Info("hold for capacity ended", "model", model, "outcome", outcome, "held", now.Sub(h.since).Round(time.Millisecond))
		delete(d.held, model)
		d.demandLocked(model, q, now) // Waiting 0, or what is left to the worker that came
	}
	if now.Sub(d.beatAt) < d.cfg.HoldBeat {
		return nil
	}
	d.beatAt = now
	var out []beat
	for model, q := range d.queues {
		if q.Len() == 0 {
			continue
		}
		cold := d.coldQueueLocked(model, q)
		items := make([]*scheduler.Item, 0, q.Len())
		q.Items(func(it *scheduler.Item) { items = append(items, it) })
		// The scheduler's order within a band is fair queueing over
		// tenants; band then arrival is close enough for a position shown
		// to a waiting client, and costs no scheduler walk.
		slices.SortFunc(items, func(a, b *scheduler.Item) int {
			return cmp.Or(cmp.Compare(a.Band, b.Band), a.Enqueued().Compare(b.Enqueued()))
		})
		for i, it := range items {
			e := it.Value.(*queued)
			if now.Sub(e.beatAt) < d.cfg.HoldBeat {
				continue
			}
			e.beatAt = now
			out = append(out, beat{reply: e.msg.Reply, q: schemas.Queued{Position: i + 1, Band: it.Band.String(),
				Dispatcher: d.cfg.ID, TimeoutMS: it.Expires.Sub(now).Milliseconds(), RequestID: e.reqID,
				CancelToken: e.msg.Header.Get(schemas.HdrCancelToken), Cold: cold, BeatMS: d.cfg.HoldBeat.Milliseconds()}})
		}
	}
	return out
}

// coldQueueLocked reports whether the requests of model's queue wait for
// capacity that is not up. One queue is one model or one adapter: its
// items share the answer.
func (d *Dispatcher) coldQueueLocked(model string, q *scheduler.Queue) bool {
	if q.Len() == 0 {
		return false
	}
	return d.serving(model, q.Peek().Value.(*queued).adapter) == 0
}

// goneColdLocked gives the requests of q that queued while a worker served
// their model (behind busy workers, or while its last worker switched away
// or died), or before the registry said the model exists, the hold's limit
// now that they are held: ColdStartTimeout from when
// they queued, never past their deadline.
func (d *Dispatcher) goneColdLocked(q *scheduler.Queue) {
	q.Items(func(it *scheduler.Item) {
		e := it.Value.(*queued)
		if e.cold {
			return
		}
		e.cold = true
		limit := it.Enqueued().Add(d.cfg.ColdStartTimeout)
		if dl := schemas.ParseDeadline(e.msg.Header.Get(schemas.HdrDeadline)); !dl.IsZero() && dl.Before(limit) {
			limit = dl
		}
		if limit.After(it.Expires) {
			it.Expires = limit
		}
	})
}

// beat is a queued frame sent again.
type beat struct {
	reply string
	q     schemas.Queued
}

func (d *Dispatcher) sendBeats(out []beat) {
	for _, b := range out {
		p, _ := json.Marshal(b.q)
		_ = d.nc.Publish(b.reply, schemas.AppendFrame(nil, schemas.FrameQueued, 0, p))
	}
}
