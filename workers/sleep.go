package workers

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Sleeping engines (docs/capacity.md#sleeping-engines). With
// Config.SleepAfter, an engine nothing has used for that long is put to
// sleep (engine.Sleeper: vLLM's sleep mode frees its GPU memory), the
// heartbeat says so at once, and dispatchers send it requests only when no
// awake worker has room. A request that finds it asleep, or falling asleep,
// waits for a wake-up, one for every request that arrives meanwhile, and
// then runs as usual: its time to first token holds the wake-up. A wake-up
// that fails fails the requests waiting on it with a retryable error
// (engine_unhealthy: the client sends them elsewhere) and the worker says it
// is unhealthy, so that nothing more is routed to it, until a wake-up
// succeeds: the worker tries again by itself, backing off, since no request
// will come to try it.
//
// "Used" is a request admitted (Worker.Running, from admission to its done
// notice: an adapter load for it included), a control operation that needs
// the engine (an adapter load or unload: hold) or a model switch
// (switch.go). The engine is never put to sleep while any lasts, and an
// engine that is falling asleep is woken again as soon as its Sleep has
// returned. When nothing is under way here the engine's own word wins
// (sync): one that says it is awake while the worker counts it asleep was
// woken otherwise (a model switch loads the new model awake; a vLLM that
// restarted comes back awake).

type sleepState int

const (
	awake sleepState = iota
	fallingAsleep
	asleep // waking up included: see sleeper.waking
)

// sleeper is a worker's sleep and wake-up policy over its engine.
type sleeper struct {
	w       *Worker
	eng     engine.Sleeper
	name    string        // the engine's, for errors
	after   time.Duration // Config.SleepAfter
	timeout time.Duration // Config.SleepTimeout: one Sleep or WakeUp call
	log     *slog.Logger
	ctx     context.Context // ends the sleep or wake-ups under way when the worker stops
	stop    context.CancelFunc
	kick    chan struct{} // cap 1: the loop looks again

	sleeps  prometheus.Counter
	wakeups *prometheus.CounterVec // by outcome: ok, error
	wakeDur prometheus.Histogram

	mu      sync.Mutex
	state   sleepState
	fell    chan struct{} // closed when the Sleep under way returns (fallingAsleep)
	waking  *wakeUp       // the wake-up under way; nil: none
	holds   int           // control operations that need the engine awake
	idleAt  time.Time     // since when nothing has used the engine
	failed  error         // the last wake-up's error, until one succeeds
	retry   time.Duration // delay of the next background wake-up after a failure
	retryAt time.Time
	wakeMS  int // the last wake-up's duration
}

// wakeUp is one WakeUp call, shared by every request that waits for it.
type wakeUp struct {
	done chan struct{}
	err  error // set before done closes
}

// Bounds of the background wake-up's backoff after a failed wake-up.
const (
	wakeRetryMin = time.Second
	wakeRetryMax = 30 * time.Second
)

// wakeBuckets are a wake-up's durations: a sim's, up to a large vLLM's
// weights coming back from CPU memory.
var wakeBuckets = []float64{.01, .025, .05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300}

// newSleeper makes w's sleeper, nil without Config.SleepAfter; an engine
// that cannot sleep is an error, naming it.
func newSleeper(w *Worker) (*sleeper, error) {
	if w.cfg.SleepAfter <= 0 {
		return nil, nil
	}
	es, ok := w.eng.(engine.Sleeper)
	if !ok {
		return nil, fmt.Errorf("sleep after %s idle (--sleep-after): the %s engine cannot sleep (sim and vllm can)", w.cfg.SleepAfter, w.eng.Name())
	}
	s := &sleeper{w: w, eng: es, name: w.eng.Name(), after: w.cfg.SleepAfter, timeout: w.cfg.SleepTimeout,
		log: w.log, kick: make(chan struct{}, 1), idleAt: time.Now(),
		sleeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenbus_worker_sleeps_total", Help: "Times the worker put its idle engine to sleep (--sleep-after)."}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_worker_wakeups_total", Help: "Wake-ups of the engine from sleep, by outcome (ok, error)."},
			[]string{"outcome"}),
		wakeDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_worker_wake_seconds", Help: "How long a wake-up of the engine from sleep took (those that succeeded).", Buckets: wakeBuckets}),
	}
	s.wakeups.WithLabelValues("ok")
	s.wakeups.WithLabelValues("error")
	s.ctx, s.stop = context.WithCancel(context.Background())
	if es.Sleeping() { // a worker started again on the same engine (a new NATS connection)
		s.state = asleep
	}
	return s, nil
}

// collectors are the sleeper's metrics.
func (s *sleeper) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.sleeps, s.wakeups, s.wakeDur,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenbus_worker_sleeping",
			Help: "1 while the engine sleeps (falling asleep and waking up included)."}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.state != awake {
				return 1
			}
			return 0
		})}
}

// report puts the sleep into a heartbeat: asleep (or falling asleep, or
// waking up), the last wake-up's duration, and unhealthy after a failed
// wake-up until one succeeds.
func (s *sleeper) report(hb *schemas.Heartbeat) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	hb.Sleeping = s.state != awake
	hb.WakeMS = s.wakeMS
	if s.failed != nil {
		hb.Healthy = false
	}
}

// awaken returns once the engine is awake, waking it if it sleeps, or
// with ctx's cause if that ends first (the wake-up goes on for the others),
// or with a retryable ErrWakeFailed if the wake-up fails. The caller is
// counted in Worker.Running or holds, so the engine does not fall asleep
// again under it. A nil sleeper (no SleepAfter) returns at once.
func (s *sleeper) awaken(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	for {
		switch s.state {
		case awake:
			s.mu.Unlock()
			return nil
		case fallingAsleep:
			fell := s.fell
			s.mu.Unlock()
			select {
			case <-fell:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			s.mu.Lock()
			continue
		case asleep:
			if s.syncLocked(time.Now()) {
				continue
			}
			op := s.waking
			if op == nil {
				op = s.wakeLocked()
			}
			s.mu.Unlock()
			select {
			case <-op.done:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			if op.err != nil {
				return schemas.ErrWakeFailed.New(s.name, s.w.cfg.ID, op.err)
			}
			s.mu.Lock()
		}
	}
}

// syncLocked takes the engine's word that it is awake when the worker
// counts it asleep and no wake-up is under way; it reports whether it did.
func (s *sleeper) syncLocked(now time.Time) bool {
	if s.state != asleep || s.waking != nil || s.eng.Sleeping() {
		return false
	}
	s.state, s.failed, s.retry, s.idleAt = awake, nil, 0, now
	s.log.Info("engine awake (woken otherwise: a model switch, a restart)")
	s.w.beatSoon()
	return true
}

// hold is awaken for a control operation, which holds the engine awake
// until release.
func (s *sleeper) hold(ctx context.Context) (release func(), err error) {
	if s == nil {
		return func() {}, nil
	}
	s.mu.Lock()
	s.holds++
	s.mu.Unlock()
	release = func() {
		s.mu.Lock()
		s.holds--
		s.idleAt = time.Now()
		s.mu.Unlock()
		s.poke()
	}
	if err := s.awaken(ctx); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// idle notes that the engine was just used: the worker's last request
// ended. The idle time counts from now.
func (s *sleeper) idle() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.idleAt = time.Now()
	s.mu.Unlock()
	s.poke()
}

func (s *sleeper) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// loop puts the engine to sleep once idle for SleepAfter, and retries a
// failed wake-up in the background, until stop closes.
func (s *sleeper) loop(stop <-chan struct{}) {
	// The worker stopping (its requests drained) cuts short a sleep or a
	// wake-up under way: nobody waits for them any more.
	go func() { <-stop; s.stop() }()
	t := time.NewTimer(s.after)
	defer t.Stop()
	for {
		wait, sleepNow := s.next(time.Now())
		if sleepNow {
			s.fallAsleep()
			continue
		}
		t.Reset(wait)
		select {
		case <-stop:
			return
		case <-s.kick:
		case <-t.C:
		}
	}
}

// next decides what the loop does now: fall asleep (the state is then
// fallingAsleep), or wait at most wait before it looks again (a change
// pokes it sooner).
func (s *sleeper) next(now time.Time) (wait time.Duration, sleepNow bool) {
	const long = time.Hour // until poked
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncLocked(now)
	switch {
	case s.state == asleep:
		if s.failed != nil && s.waking == nil {
			// Unhealthy, no request comes to wake it: try again, backing off.
			if now.Before(s.retryAt) {
				return s.retryAt.Sub(now), false
			}
			s.wakeLocked()
		}
		return min(s.after, time.Second), false // then sync again
	case s.state != awake, s.w.draining.Load():
		return long, false
	case s.holds > 0 || s.w.Running() > 0 || s.w.sw.active.Load() || len(s.w.adapters.Loading()) > 0:
		// Busy: idle from no earlier than now. Its end pokes the loop
		// (idle, hold's release); the wait is a safety net.
		s.idleAt = now
		return s.after, false
	}
	if due := s.idleAt.Add(s.after); now.Before(due) {
		return due.Sub(now), false
	}
	// Running() was read under s.mu: a request admitted after this finds
	// fallingAsleep in awaken and waits for the Sleep to end.
	s.state, s.fell = fallingAsleep, make(chan struct{})
	return 0, true
}

// fallAsleep runs the Sleep that next decided on.
func (s *sleeper) fallAsleep() {
	s.w.beatSoon() // sleeping from now: dispatchers look elsewhere first
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	err := s.eng.Sleep(ctx)
	cancel()
	// A Sleep cut short may have happened all the same: the engine says.
	slept := err == nil || s.eng.Sleeping()
	s.mu.Lock()
	if slept {
		s.state = asleep
	} else {
		s.state, s.idleAt = awake, time.Now() // try again after another SleepAfter
	}
	close(s.fell)
	s.mu.Unlock()
	switch {
	case err != nil && !slept:
		s.log.Warn("engine did not fall asleep; trying again after the next idle spell", "err", err, "sleep_after", s.after)
	case err != nil:
		s.log.Warn("engine sleep call failed, but the engine is asleep", "err", err)
	default:
		s.log.Info("engine asleep", "idle_for", s.after, "took", time.Since(start))
	}
	if slept {
		s.sleeps.Inc()
	}
	s.w.beatSoon()
}

// wakeLocked starts a wake-up; the state is asleep and none is under way.
func (s *sleeper) wakeLocked() *wakeUp {
	op := &wakeUp{done: make(chan struct{})}
	s.waking = op
	go s.wake(op)
	return op
}

// wake runs one WakeUp, bounded by SleepTimeout and the worker's life (not
// by any one request's: others may be waiting on it), and settles op.
func (s *sleeper) wake(op *wakeUp) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	err := s.eng.WakeUp(ctx)
	cancel()
	took := time.Since(start)
	s.mu.Lock()
	s.waking = nil
	if err == nil {
		s.state, s.failed, s.retry = awake, nil, 0
		s.wakeMS = max(int(took.Milliseconds()), 1) // 0 in a heartbeat is "none measured"
		s.idleAt = time.Now()
	} else {
		s.failed = err
		s.retry = min(max(2*s.retry, wakeRetryMin), wakeRetryMax)
		s.retryAt = time.Now().Add(s.retry)
	}
	retry := s.retry
	op.err = err
	close(op.done)
	s.mu.Unlock()
	if err != nil {
		s.wakeups.WithLabelValues("error").Inc()
		s.log.Error("engine did not wake up: unhealthy until it does", "err", err, "took", took, "retry_in", retry)
	} else {
		s.wakeups.WithLabelValues("ok").Inc()
		s.wakeDur.Observe(took.Seconds())
		s.log.Info("engine awake", "took", took)
	}
	s.w.beatSoon()
	s.poke()
}
