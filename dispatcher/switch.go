package dispatcher

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/schemas"
)

// Models switched on a shared pool (docs/capacity.md): requests that wait
// here for a model no live worker serves, while some worker could switch to
// it (Heartbeat.CanServe), make this dispatcher ask one to switch. The
// worker drains and loads the model; its next heartbeat lists it, and the
// queue goes out as for any worker that joins (onHeartbeat → drain).

// switchAskTimeout bounds one switch request: the worker answers at once
// (it accepts or refuses; the switch itself goes on after the answer).
const switchAskTimeout = 2 * time.Second

// switchSettle is how long after an answer the dispatcher asks nothing more
// for the model: long enough for the worker's heartbeat to say it switches,
// after which the choice sees that by itself.
const switchSettle = time.Second

// switchAsks keeps one switch request per model in flight, and none for a
// while after its answer.
type switchAsks struct {
	mu    sync.Mutex
	until map[string]time.Time // model → no new request before then
}

// begin reports whether a switch to model may be asked now, and if so
// holds the model until end.
func (s *switchAsks) begin(model string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[string]time.Time{}
	}
	for m, t := range s.until { // a handful of models at most
		if !now.Before(t) {
			delete(s.until, m)
		}
	}
	if _, held := s.until[model]; held {
		return false
	}
	s.until[model] = now.Add(switchAskTimeout + switchSettle) // until end
	return true
}

// end lets model be asked for again after wait.
func (s *switchAsks) end(model string, wait time.Duration) {
	s.mu.Lock()
	s.until[model] = time.Now().Add(wait)
	s.mu.Unlock()
}

// switchModels is called by every sweep: for each model with requests
// waiting here that no live worker serves but some could switch to, it asks
// the worker chooseSwitch picks. It never blocks: the request goes in a
// goroutine of its own.
func (d *Dispatcher) switchModels(now time.Time) {
	var waiting map[string]int // model → requests queued here (an adapter's count for its base)
	d.mu.Lock()
	for model, q := range d.queues {
		if q.Len() == 0 {
			continue
		}
		if waiting == nil {
			waiting = map[string]int{}
		}
		if head := q.Peek().Value.(*queued); head.adapter != nil {
			model = head.adapter.base
		}
		waiting[model] += q.Len()
	}
	d.mu.Unlock()
	if len(waiting) == 0 {
		return
	}
	// The most awaited model first, so that it gets the best worker.
	models := slices.SortedFunc(maps.Keys(waiting), func(a, b string) int {
		return cmp.Or(cmp.Compare(waiting[b], waiting[a]), cmp.Compare(a, b))
	})
	var workers []fleet.Worker
	for _, model := range models {
		if d.fleet.Serving(model) > 0 || d.fleet.Switchable(model) == 0 || !d.switches.begin(model, now) {
			continue
		}
		if workers == nil {
			workers = d.fleet.Workers()
		}
		id, ok := chooseSwitch(model, workers, waiting, now)
		if !ok {
			d.switches.end(model, 0)
			continue
		}
		// Taken for this model: not chosen again for another in this sweep.
		for i := range workers {
			if workers[i].Worker == id {
				workers[i].Switching = model
			}
		}
		go d.askSwitch(model, id)
	}
}

// askSwitch asks worker to switch to model, and holds the model for
// switchSettle after the answer (or until the Retry-After of a refusal).
func (d *Dispatcher) askSwitch(model, worker string) {
	b, _ := json.Marshal(schemas.SwitchRequest{Model: model, Dispatcher: d.cfg.ID})
	outcome, wait := "accepted", switchSettle
	msg, err := d.nc.Request(schemas.CtlSubject(worker, schemas.CtlSwitch), b, switchAskTimeout)
	var e *schemas.Error
	if err == nil {
		e = schemas.ReadCtlReply(msg.Data, worker, schemas.CtlSwitch)
	}
	switch {
	case err != nil:
		outcome = "error"
		d.log.Warn("switch request not answered", "worker", worker, "model", model, "err", err)
	case e != nil:
		outcome = "refused"
		wait = max(wait, time.Duration(e.RetryAfter)*time.Second)
		d.log.Info("switch refused", "worker", worker, "model", model, "err", e.Body.Message)
	default:
		d.log.Info("asked a worker to switch models", "worker", worker, "model", model)
	}
	d.m.switchRequests.WithLabelValues(outcome).Inc()
	d.switches.end(model, wait)
}

// chooseSwitch picks the worker to switch to model, from a snapshot of the
// fleet and of the requests queued here by model: none while a worker is
// switching to it already; else, of the live, healthy, non-draining workers
// that list it in CanServe, are not switching and whose hold has passed
// (LoadedAt + HoldMS), the one with no request running first, then the one
// whose loaded models have the least demand (requests queued here for them,
// then its requests running), ties to the lowest id: dispatchers that choose
// at once with the same view pick the same worker, which takes the second
// request as the first.
func chooseSwitch(model string, workers []fleet.Worker, queued map[string]int, now time.Time) (string, bool) {
	type cand struct {
		id              string
		busy            int // 1 when a request runs there
		demand, running int
	}
	var best *cand
	for _, w := range workers {
		if w.Switching == model {
			return "", false
		}
		if w.Switching != "" || w.Draining || !w.Healthy || w.Role == schemas.RolePrefill || !slices.Contains(w.CanServe, model) ||
			slices.Contains(w.Models, model) || now.Before(holdEnds(w.Heartbeat)) {
			continue
		}
		c := cand{id: w.Worker, running: max(w.Running, w.Load)}
		if c.running > 0 {
			c.busy = 1
		}
		for _, m := range w.Models {
			c.demand += queued[m]
		}
		if best == nil || cmp.Or(cmp.Compare(c.busy, best.busy), cmp.Compare(c.demand, best.demand),
			cmp.Compare(c.running, best.running), cmp.Compare(c.id, best.id)) < 0 {
			best = &c
		}
	}
	if best == nil {
		return "", false
	}
	return best.id, true
}

// holdEnds is when a worker's hold on the model it serves ends: it refuses
// to switch away before.
func holdEnds(hb schemas.Heartbeat) time.Time {
	return time.UnixMilli(hb.LoadedAt).Add(time.Duration(hb.HoldMS) * time.Millisecond)
}
