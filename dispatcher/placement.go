package dispatcher

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/decay"
	"github.com/tokenbus/tokenbus/schemas"
)

// PlacementConfig turns on and tunes adapter placement by demand
// (docs/routing.md): the dispatcher counts requests per LoRA adapter and,
// every Every, loads a hot adapter onto one more worker (load_adapter on its
// control subject) or unloads a cold one's spare replica. Zero values take
// the defaults shown.
type PlacementConfig struct {
	On    bool
	Every time.Duration // decision period; default 2s
	// HalfLife is how fast the request rate forgets: a request counts half
	// as much HalfLife later. Default 10s. The rates are counted with
	// placement off too (routing chooses the worker to evict on by them),
	// with this HalfLife and MaxAdapters.
	HalfLife time.Duration
	// Up: an adapter gets one more replica while its rate per replica
	// (requests/s) is above Up. Down: a replica is unloaded while the rate
	// per remaining replica would be below Down. Defaults 4 and 1; Down is
	// capped at Up/2 so that adding a replica can never make it removable.
	Up, Down float64
	// MinInterval is the least time between two placement changes of one
	// adapter (hysteresis in time); default 30s.
	MinInterval time.Duration
	// MaxAdapters bounds the rate map; the coldest entry makes way. Default 1024.
	MaxAdapters int
	// CtlTimeout bounds one load or unload; default 60s.
	CtlTimeout time.Duration
}

func (c *PlacementConfig) defaults() {
	if c.Every <= 0 {
		c.Every = 2 * time.Second
	}
	if c.HalfLife <= 0 {
		c.HalfLife = 10 * time.Second
	}
	if c.Up <= 0 {
		c.Up = 4
	}
	if c.Down <= 0 {
		c.Down = 1
	}
	c.Down = min(c.Down, c.Up/2)
	if c.MinInterval <= 0 {
		c.MinInterval = 30 * time.Second
	}
	if c.MaxAdapters <= 0 {
		c.MaxAdapters = 1024
	}
	if c.CtlTimeout <= 0 {
		c.CtlTimeout = 60 * time.Second
	}
}

// adapterDemand is what the placer knows of one adapter.
type adapterDemand struct {
	name, base, path string
	r                decay.Rate // requests/s, counted
	rate             float64    // r decayed to the time of a snapshot (snapshot's copies only)
	changed          time.Time  // last placement change (zero: never)
}

// demand counts requests per adapter: an exponentially decayed rate whose
// sum over a steady stream of r requests/s tends to r. Bounded: at
// MaxAdapters entries the coldest one is dropped for a new one.
type demand struct {
	cfg PlacementConfig
	mu  sync.Mutex
	m   map[string]*adapterDemand
}

func newDemand(cfg PlacementConfig) *demand {
	return &demand{cfg: cfg, m: map[string]*adapterDemand{}}
}

// observe counts one request for adapter (once per request, not per bounce).
func (d *demand) observe(name string, ad *adapterRef, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.m[name]
	if a == nil {
		if len(d.m) >= d.cfg.MaxAdapters {
			d.dropColdestLocked(now)
		}
		a = &adapterDemand{name: name}
		d.m[name] = a
	}
	a.base, a.path = ad.base, ad.path // the registry's latest
	a.r.Count(now, d.cfg.HalfLife)
}

func (d *demand) dropColdestLocked(now time.Time) {
	var cold *adapterDemand
	for _, a := range d.m {
		if cold == nil || a.r.Now(now, d.cfg.HalfLife) < cold.r.Now(now, d.cfg.HalfLife) {
			cold = a
		}
	}
	if cold != nil {
		delete(d.m, cold.name)
	}
}

// rate is adapter's decayed request rate at now (0: never counted, or
// pushed out of the map).
func (d *demand) rate(name string, now time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a := d.m[name]; a != nil {
		return a.r.Now(now, d.cfg.HalfLife)
	}
	return 0
}

// snapshot returns every adapter's demand with its rate decayed to now.
func (d *demand) snapshot(now time.Time) []adapterDemand {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]adapterDemand, 0, len(d.m))
	for _, a := range d.m {
		c := *a
		c.rate = a.r.Now(now, d.cfg.HalfLife)
		out = append(out, c)
	}
	return out
}

// changedAt records a placement change of adapter (attempted: a failed load
// waits MinInterval too, rather than being retried every period).
func (d *demand) changedAt(name string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a := d.m[name]; a != nil {
		a.changed = now
	}
}

// placeAction is one placement change: load adapter on worker (after
// unloading evict there, when set), or unload it.
type placeAction struct {
	load    bool
	worker  string
	adapter adapterDemand
	evict   string // load only: a cold adapter to unload first to free a slot
}

// decide is the placement policy, pure so that tests can table it. For each
// adapter, hottest first, that some worker already holds (requests load it
// the first time; placement only adds and removes replicas) and that has not
// changed within MinInterval:
//   - rate per replica above Up: load it on the eligible worker (live,
//     healthy, non-draining, serving its base, not holding it) with the most
//     free slots, then the lowest load ratio, then the lowest id; with no free
//     slot anywhere, on the worker holding the coldest adapter whose rate per
//     replica is below Down, unloading that one first;
//   - more than one replica, and rate per remaining replica below Down:
//     unload it from the holder with the highest id.
//
// The choices are deterministic for one view of the fleet, so that several
// dispatchers placing at once send the same (idempotent) load or unload
// rather than each adding or removing a replica.
func decide(cfg PlacementConfig, now time.Time, ds []adapterDemand, workers []fleet.Worker) []placeAction {
	slices.SortFunc(ds, func(a, b adapterDemand) int {
		return cmp.Or(cmp.Compare(b.rate, a.rate), cmp.Compare(a.name, b.name))
	})
	byName := make(map[string]*adapterDemand, len(ds))
	for i := range ds {
		byName[ds[i].name] = &ds[i]
	}
	type slot struct {
		w        *fleet.Worker
		held     map[string]bool
		used     int
		excluded bool
	}
	ws := make([]*slot, 0, len(workers))
	for i := range workers {
		w := &workers[i]
		s := &slot{w: w, held: map[string]bool{}, excluded: w.Draining || !w.Healthy}
		for _, a := range w.Adapters {
			s.held[a] = true
		}
		for _, a := range w.Loading {
			s.held[a] = true
		}
		s.used = len(s.held)
		ws = append(ws, s)
	}
	serves := func(s *slot, base string) bool { return !s.excluded && slices.Contains(s.w.Models, base) }
	replicas := func(a *adapterDemand) (holders []*slot) {
		for _, s := range ws {
			if s.held[a.name] && serves(s, a.base) {
				holders = append(holders, s)
			}
		}
		return holders
	}
	// perReplica is the rate an adapter's replicas each carry; an adapter this
	// dispatcher has no record of is as cold as can be.
	perReplica := func(name string) float64 {
		a := byName[name]
		if a == nil {
			return 0
		}
		return a.rate / float64(max(len(replicas(a)), 1))
	}
	touched := map[string]bool{}
	var out []placeAction
	for i := range ds {
		a := &ds[i]
		if touched[a.name] || (!a.changed.IsZero() && now.Sub(a.changed) < cfg.MinInterval) {
			continue
		}
		holders := replicas(a)
		n := len(holders)
		if n == 0 {
			continue
		}
		switch {
		case a.rate/float64(n) > cfg.Up:
			var best *slot
			var bestFree int
			var evict string
			for _, s := range ws {
				if s.held[a.name] || !serves(s, a.base) {
					continue
				}
				free := math.MaxInt // max_loras 0: no limit known
				if s.w.MaxLoras > 0 {
					free = s.w.MaxLoras - s.used
				}
				if free <= 0 {
					continue
				}
				if best == nil || free > bestFree || (free == bestFree && better(s.w, best.w)) {
					best, bestFree = s, free
				}
			}
			if best == nil { // no free slot: make one where the coldest adapter is
				coldest := cfg.Down
				for _, s := range ws {
					if s.held[a.name] || !serves(s, a.base) {
						continue
					}
					for _, c := range s.w.Adapters { // not one still loading
						if r := perReplica(c); r < coldest && !touched[c] && changedOK(byName[c], now, cfg) {
							best, evict, coldest = s, c, r
						}
					}
				}
			}
			if best == nil {
				continue
			}
			out = append(out, placeAction{load: true, worker: best.w.Worker, adapter: *a, evict: evict})
			touched[a.name] = true
			best.held[a.name] = true
			if evict != "" {
				touched[evict] = true
				delete(best.held, evict)
			} else {
				best.used++
			}
		case n > 1 && a.rate/float64(n-1) < cfg.Down:
			last := holders[0]
			for _, s := range holders[1:] {
				if s.w.Worker > last.w.Worker {
					last = s
				}
			}
			out = append(out, placeAction{worker: last.w.Worker, adapter: *a})
			touched[a.name] = true
			delete(last.held, a.name)
			last.used--
		}
	}
	return out
}

// changedOK reports whether adapter a (nil: not tracked) may change now.
func changedOK(a *adapterDemand, now time.Time, cfg PlacementConfig) bool {
	return a == nil || a.changed.IsZero() || now.Sub(a.changed) >= cfg.MinInterval
}

// better orders workers for a new replica: lower load ratio, then lower id.
func better(a, b *fleet.Worker) bool {
	ra, rb := loadRatio(a), loadRatio(b)
	if ra != rb {
		return ra < rb
	}
	return a.Worker < b.Worker
}

func loadRatio(w *fleet.Worker) float64 {
	if w.MaxConcurrency <= 0 {
		return 0
	}
	return float64(w.Load) / float64(w.MaxConcurrency) // Load counts the waiting too
}

// place runs the placement loop until ctx ends: one decision per period,
// its actions sent one after another (a load may take seconds; meanwhile
// heartbeats list it as loading, which the next decision sees).
func (d *Dispatcher) place(ctx context.Context) {
	cfg := d.cfg.Placement
	t := time.NewTicker(cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, act := range decide(cfg, now, d.demand.snapshot(now), d.fleet.Workers()) {
				if ctx.Err() != nil {
					return
				}
				d.apply(ctx, act)
			}
		}
	}
}

// apply sends one placement action's control requests.
func (d *Dispatcher) apply(ctx context.Context, act placeAction) {
	now := time.Now()
	a := act.adapter
	d.demand.changedAt(a.name, now)
	if act.evict != "" {
		d.demand.changedAt(act.evict, now)
		err := d.ctl(ctx, act.worker, schemas.CtlUnloadAdapter, schemas.AdapterRequest{Name: act.evict})
		d.placed("evict", err)
		if err != nil {
			d.log.Warn("adapter placement: unload failed", "adapter", act.evict, "worker", act.worker, "err", err)
			return
		}
		d.log.Info("adapter placement: unloaded a cold adapter for a hot one", "adapter", act.evict, "for", a.name, "worker", act.worker)
	}
	op, action := schemas.CtlUnloadAdapter, "unload"
	req := schemas.AdapterRequest{Name: a.name}
	if act.load {
		op, action = schemas.CtlLoadAdapter, "load"
		req.Base, req.Path = a.base, a.path
	}
	err := d.ctl(ctx, act.worker, op, req)
	d.placed(action, err)
	if err != nil {
		d.log.Warn("adapter placement: "+action+" failed", "adapter", a.name, "worker", act.worker, "err", err)
		return
	}
	d.log.Info("adapter placement: "+action, "adapter", a.name, "worker", act.worker, "rate", a.rate)
}

func (d *Dispatcher) placed(action string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	d.m.adapterPlaced.WithLabelValues(action, result).Inc()
}

// ctl sends one control request to worker and reads its CtlReply.
func (d *Dispatcher) ctl(ctx context.Context, worker, op string, body schemas.AdapterRequest) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Placement.CtlTimeout)
	defer cancel()
	b, _ := json.Marshal(body)
	msg, err := d.nc.RequestWithContext(ctx, schemas.CtlSubject(worker, op), b)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return schemas.ErrWorkerUnreachable.New(worker, "it is gone")
		}
		return err
	}
	if e := schemas.ReadCtlReply(msg.Data, worker, op); e != nil {
		return e // not a typed nil in the error
	}
	return nil
}
