package workers

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Models switched on a shared pool (docs/capacity.md): a worker whose engine
// can serve several models, one loaded at a time (engine.Switcher), switches
// when a dispatcher asks (schemas.CtlSwitch). It stops taking requests (they
// go back to their dispatchers, which queue them), lets those running finish
// (for DrainTimeout at most, then cancels them so that their clients go on
// elsewhere), has the engine load the new model and heartbeats it. A model
// stays loaded SwitchHold at least before the worker switches away from it:
// the hysteresis that keeps two busy models from making the pool thrash.

// switcher is the worker's switching state.
type switcher struct {
	eng      engine.Switcher // nil: the engine serves fixed models
	canServe []string        // eng.CanServe(), read once
	hold     time.Duration

	// active: a switch is under way, so a request is bounced rather than
	// run. Read with every request, apart from mu; set before the switch
	// waits for the running count to fall to 0, and onRequest reads it
	// after admit counted its request: one of the two sees the other.
	active atomic.Bool

	ctx  context.Context // ends the switch under way when the worker stops
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	to       string    // the model switching to; "" when none
	loadedAt time.Time // when the model served now was loaded (the start for the first)
	closed   bool

	m switchMetrics
}

type switchMetrics struct {
	switches *prometheus.CounterVec // by from, to, outcome
	seconds  prometheus.Histogram
}

func (w *Worker) newSwitcher() {
	s := &w.sw
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.hold = w.cfg.SwitchHold
	s.loadedAt = time.Now()
	if sw, ok := w.eng.(engine.Switcher); ok && len(sw.CanServe()) > 0 {
		s.eng, s.canServe = sw, sw.CanServe()
	}
	s.m = switchMetrics{
		switches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokenbus_worker_switches_total",
			Help: "Model switches asked of the worker, by the model loaded (from), the model asked for (to) and outcome: ok, failed (the engine could not load it), cancelled (the worker stopped), refused_hold (within --switch-hold), refused_busy (switching to another already)."},
			[]string{"from", "to", "outcome"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tokenbus_worker_switch_seconds",
			Help:    "Model switches that succeeded, from acceptance to the new model served: the running requests' drain and the engine's load.",
			Buckets: []float64{.1, .25, .5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200}}),
	}
}

// collectors are the switch metrics, for a worker that can switch.
func (s *switcher) collectors() []prometheus.Collector {
	if s.eng == nil {
		return nil
	}
	return []prometheus.Collector{s.m.switches, s.m.seconds}
}

// close ends a switch under way and waits for it; no switch starts after.
func (s *switcher) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
}

// target is the model the worker is switching to, "" when none.
func (s *switcher) target() string {
	if !s.active.Load() {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.to
}

// beat fills in the heartbeat's switching fields.
func (s *switcher) beat(hb *schemas.Heartbeat) {
	if s.eng == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	hb.CanServe, hb.Switching = s.canServe, s.to
	hb.LoadedAt, hb.HoldMS = s.loadedAt.UnixMilli(), int(s.hold/time.Millisecond)
}

// loaded is the model among canServe that the engine serves now ("" when
// none: a switch failed past recovery).
func (w *Worker) loadedModel() string {
	for _, m := range w.eng.Models() {
		if slices.Contains(w.sw.canServe, m) {
			return m
		}
	}
	return ""
}

// onSwitch answers a CtlSwitch at once: accepted (the switch goes on
// without the asker, who learns of its end from the heartbeats) or refused.
func (w *Worker) onSwitch(m *nats.Msg, reply func(error)) {
	var req schemas.SwitchRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Model == "" {
		reply(schemas.ErrSwitchUnknownModel.New(w.cfg.ID, req.Model, w.canServeList()))
		return
	}
	reply(w.startSwitch(req))
}

func (w *Worker) canServeList() string {
	if len(w.sw.canServe) == 0 {
		return "only the models it serves (it cannot switch)"
	}
	return strings.Join(w.sw.canServe, ", ")
}

// startSwitch checks a switch and starts it; nil for one accepted or with
// nothing to do.
func (w *Worker) startSwitch(req schemas.SwitchRequest) error {
	s := &w.sw
	if s.eng == nil || !slices.Contains(s.canServe, req.Model) {
		return schemas.ErrSwitchUnknownModel.New(w.cfg.ID, req.Model, w.canServeList())
	}
	if w.draining.Load() {
		return errShutdown
	}
	from := w.loadedModel()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errShutdown
	case s.to == req.Model:
		return nil // another dispatcher asked first
	case s.to != "":
		s.m.switches.WithLabelValues(from, req.Model, "refused_busy").Inc()
		return schemas.ErrSwitchBusy.New(w.cfg.ID, s.to)
	case from == req.Model:
		return nil
	}
	if held := time.Since(s.loadedAt); held < s.hold {
		s.m.switches.WithLabelValues(from, req.Model, "refused_hold").Inc()
		left := int(math.Ceil((s.hold - held).Seconds()))
		return schemas.ErrSwitchHold.New(w.cfg.ID, from, held.Round(time.Millisecond).String(), s.hold.String()).WithRetryAfter(left)
	}
	s.to = req.Model
	s.active.Store(true)
	s.wg.Add(1)
	w.log.Info("switching model", "from", from, "to", req.Model, "asked_by", req.Dispatcher, "running", w.Running())
	w.beatSoon()
	go w.runSwitch(from, req.Model)
	return nil
}

// runSwitch waits for the running requests to finish, then has the engine
// load the new model.
func (w *Worker) runSwitch(from, to string) {
	s := &w.sw
	defer s.wg.Done()
	start := time.Now()
	if n := w.waitIdle(s.ctx, w.cfg.DrainTimeout); n > 0 {
		// Their clients go on elsewhere: the code is shutting_down, which
		// clients retry and migrate on.
		cause := schemas.ErrWorkerSwitching.New(w.cfg.ID, to)
		w.mu.Lock()
		for _, c := range w.inflight {
			c.cancel(cause)
		}
		w.mu.Unlock()
		w.log.Warn("switch: drain timeout, cancelled the requests still running", "to", to, "count", n, "drain_timeout", w.cfg.DrainTimeout)
		w.waitIdle(s.ctx, 5*time.Second)
	}
	drained := time.Since(start)
	err := s.eng.Switch(s.ctx, to)
	outcome := "ok"
	switch {
	case err != nil && s.ctx.Err() != nil:
		outcome = "cancelled"
		w.log.Info("switch cancelled: the worker stops", "from", from, "to", to)
	case err != nil:
		outcome = "failed"
		w.log.Error("switch failed", "from", from, "to", to, "err", err, "serving", w.eng.Models())
	default:
		s.m.seconds.Observe(time.Since(start).Seconds())
		w.log.Info("switched model", "from", from, "to", to, "drain", drained.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	}
	s.m.switches.WithLabelValues(from, to, outcome).Inc()
	s.mu.Lock()
	// A failed switch counts as a load too: the hold keeps dispatchers
	// from asking again at once.
	s.to, s.loadedAt = "", time.Now()
	s.active.Store(false)
	s.mu.Unlock()
	w.beatSoon()
}

// waitIdle waits until no request runs, for timeout at most (or until ctx
// ends), and returns how many still run. New requests are bounced
// meanwhile, so the count only falls; a switch is rare, so a poll is cheap.
func (w *Worker) waitIdle(ctx context.Context, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		n := w.Running()
		if n == 0 || !time.Now().Before(deadline) {
			return n
		}
		select {
		case <-ctx.Done():
			return w.Running()
		case <-t.C:
		}
	}
}
