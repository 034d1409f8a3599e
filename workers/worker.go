package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/internal/runners"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/lora"
)

// Config tunes a Worker. Zero values take the defaults shown.
type Config struct {
	ID             string // required; a valid subject token
	MaxConcurrency int    // hard admission cap; default 256
	// HeartbeatInterval: default 250ms. Three missed beats and the worker is
	// gone: a dead worker is noticed, and its streams end, within 1s.
	HeartbeatInterval time.Duration
	KeepaliveInterval time.Duration // silence after which a stream gets a keepalive; default 2s
	DrainTimeout      time.Duration // how long in-flight requests may run on shutdown; default 30s
	Version           string
	// ChunkLinger is how long a chunk may wait for more of its stream's
	// chunks to share one message, when the stream's previous chunk left
	// less than this ago; 0 means the default, 1ms; negative: never wait.
	ChunkLinger time.Duration
	// Metrics is where the worker registers its metrics (nil: nowhere).
	Metrics prometheus.Registerer

	AdapterLoadTimeout time.Duration // longest one LoRA adapter load (or eviction, or unload) may take; default 5m
	// AdapterUnloadGrace is how long an unload ordered by a control request
	// waits for the requests running on the adapter before it unloads it
	// anyway; default 5s.
	AdapterUnloadGrace time.Duration

	// SwitchHold is how long a model stays loaded at least before the
	// worker switches away from it, for an engine that serves several
	// models one at a time (switch.go); default 30s.
	SwitchHold time.Duration

	// Usage takes the usage records of NATS-native tenant requests (see
	// UsageSink); default: NATSUsageSink on the worker's connection.
	Usage UsageSink

	// Local hands reply frames to a client in this process past the bus
	// (dev's gateway; see LocalReplies); nil: every frame goes on the bus.
	Local LocalReplies

	// SleepAfter: an engine unused this long is put to sleep and woken by
	// the next request (sleep.go); 0: never. The engine must be an
	// engine.Sleeper. SleepTimeout bounds one sleep or wake-up; default 5m.
	SleepAfter   time.Duration
	SleepTimeout time.Duration

	// Role is the worker's part in prefill/decode disaggregation
	// (disagg.go): schemas.RoleBoth (""), RolePrefill or RoleDecode. A
	// prefill or decode worker needs an engine that speaks vLLM's KV
	// transfer (engine.KVTransferer).
	Role string
}

func (c *Config) defaults() {
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = 256
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 250 * time.Millisecond
	}
	if c.ChunkLinger == 0 {
		c.ChunkLinger = time.Millisecond
	}
	if c.KeepaliveInterval <= 0 {
		c.KeepaliveInterval = 2 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.AdapterLoadTimeout <= 0 {
		c.AdapterLoadTimeout = 5 * time.Minute
	}
	if c.AdapterUnloadGrace <= 0 {
		c.AdapterUnloadGrace = 5 * time.Second
	}
	if c.SwitchHold <= 0 {
		c.SwitchHold = 30 * time.Second
	}
	if c.SleepTimeout <= 0 {
		c.SleepTimeout = 5 * time.Minute
	}
}

// Worker runs one engine behind the bus.
type Worker struct {
	cfg Config
	nc  *nats.Conn
	eng engine.Engine
	log *slog.Logger

	// runs serves requests on kept goroutines: a new one per request grew
	// its stack in the engine's HTTP client every time.
	runs          *runners.Runners
	cancelSubject string // schemas.CancelSubject(cfg.ID)
	doneSubject   string // schemas.DoneSubject(cfg.ID)

	adapters *lora.Manager // every adapter load and unload goes through it
	sw       switcher      // model switches (switch.go)
	sleep    *sleeper      // nil: the engine never sleeps (sleep.go)
	usage    UsageSink
	// kvTransfer: the engine speaks vLLM's KV-transfer handshake (disagg.go).
	kvTransfer bool
	prefills   prefillReplies // answers to this worker's remote prefills (disagg.go)

	running  atomic.Int64
	draining atomic.Bool
	// serving: subscribed to the work subject and not stopping, so Take
	// may hand requests over; takeMu makes the stop wait for a Take under
	// way (its wg.Add must come before the drain's wg.Wait).
	takeMu  sync.RWMutex
	serving bool
	m       *metrics
	hbSeq   atomic.Uint64
	wake    chan struct{} // asks the heartbeat loop for an early beat

	// partSize is the largest frame payload sent in one message: the
	// server's max_payload less room for the frame and mux headers; larger
	// payloads go as parts (schemas.FramePart).
	partSize atomic.Int64

	healthMu sync.Mutex
	healthAt time.Time // when the engine was last asked (see health)
	healthy  bool
	ready    chan struct{} // closed once Run has subscribed

	lingerMu   sync.Mutex
	lingering  []lingerer    // streams and outboxes holding frames back
	lingerKick chan struct{} // cap 1: the linger loop has work

	outMu    sync.Mutex
	outboxes map[string]*outbox // by reply prefix

	mu       sync.Mutex
	inflight map[string]*call // by request id and cancel token (call.key)
	wg       sync.WaitGroup
}

// New makes a worker; Run starts it.
func New(cfg Config, nc *nats.Conn, eng engine.Engine, log *slog.Logger) (*Worker, error) {
	cfg.defaults()
	if !schemas.ValidToken(cfg.ID) {
		return nil, errors.New("worker id must be a non-empty subject token (no '.', '*', '>' or spaces)")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{cfg: cfg, nc: nc, eng: eng, log: log.With("worker", cfg.ID), cancelSubject: schemas.CancelSubject(cfg.ID), doneSubject: schemas.DoneSubject(cfg.ID),
		inflight: map[string]*call{}, wake: make(chan struct{}, 1), ready: make(chan struct{}),
		lingerKick: make(chan struct{}, 1), outboxes: map[string]*outbox{}, runs: runners.New(10 * time.Second)}
	w.adapters = lora.New(eng, lora.Config{Worker: cfg.ID, LoadTimeout: cfg.AdapterLoadTimeout,
		UnloadGrace: cfg.AdapterUnloadGrace, Logger: w.log, Changed: w.beatSoon})
	var err error
	if w.sleep, err = newSleeper(w); err != nil {
		return nil, err
	}
	if _, ok := schemas.ParseRole(cfg.Role); !ok {
		return nil, fmt.Errorf("worker role %q: want prefill, decode or both", cfg.Role)
	}
	w.kvTransfer = kvTransfer(eng)
	w.prefills.nc = nc
	if cfg.Role != schemas.RoleBoth && !w.kvTransfer {
		return nil, fmt.Errorf("a %s worker needs an engine that speaks vLLM's KV transfer (the sim; vllm with --kv-transfer-config); the %s engine does not", cfg.Role, eng.Name())
	}
	w.setPartSize(nc.MaxPayload())
	w.usage = cfg.Usage
	if w.usage == nil {
		w.usage = NATSUsageSink{NC: nc, Source: cfg.ID, Log: w.log}
	}
	w.newSwitcher()
	w.registerMetrics(cfg.Metrics)
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Ready is closed once the worker takes requests.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// AdapterStats counts what the worker's adapter manager did.
type AdapterStats = lora.Stats

// AdapterStats returns the adapter manager's counters.
func (w *Worker) AdapterStats() AdapterStats { return w.adapters.Stats() }

// Running is the number of requests admitted and not finished.
func (w *Worker) Running() int { return int(w.running.Load()) }

// Drain stops taking new requests; those in flight go on.
func (w *Worker) Drain() {
	if !w.draining.Swap(true) {
		w.log.Info("draining")
		w.beatSoon()
	}
}

// Run serves until ctx ends, then drains: it stops taking work, lets in-flight
// requests finish within DrainTimeout, cancels the rest and returns.
func (w *Worker) Run(ctx context.Context) error {
	var subs []*nats.Subscription
	sub := func(subject string, h nats.MsgHandler) error {
		s, err := w.nc.Subscribe(subject, h)
		if err != nil {
			return err
		}
		// Requests arrive in bursts at high rates; never drop them silently.
		_ = s.SetPendingLimits(1<<20, 1<<30)
		subs = append(subs, s)
		return nil
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	// Two workers with one id would both take every request sent to it and
	// answer each twice: refuse to start if the id answers already.
	if _, err := w.nc.Request(schemas.CtlSubject(w.cfg.ID, schemas.CtlPing), nil, 500*time.Millisecond); err == nil {
		return fmt.Errorf("worker id %q is already in use by a running worker", w.cfg.ID)
	}
	if err := sub(schemas.WorkSubject(w.cfg.ID), w.onRequest); err != nil {
		return err
	}
	if err := sub(w.cancelSubject, w.onCancel); err != nil {
		return err
	}
	if w.kvTransfer { // prefills for other workers (disagg.go)
		if err := sub(schemas.PrefillSubject(w.cfg.ID), w.onPrefill); err != nil {
			return err
		}
		if err := sub(schemas.PrefillCancelSubject(w.cfg.ID), w.onCancel); err != nil {
			return err
		}
	}
	if err := sub(schemas.CtlSubject(w.cfg.ID, "*"), w.onControl); err != nil {
		return err
	}
	if err := w.nc.Flush(); err != nil {
		return err
	}
	w.takeMu.Lock()
	w.serving = true
	w.takeMu.Unlock()
	close(w.ready)
	w.log.Info("worker up", "engine", w.eng.Name(), "models", w.eng.Models(), "max_concurrency", w.cfg.MaxConcurrency)

	stop := make(chan struct{})
	loops := sync.WaitGroup{}
	loops.Add(4)
	go func() { defer loops.Done(); w.heartbeatLoop(stop) }()
	go func() { defer loops.Done(); w.kvEventsLoop(stop) }()
	go func() { defer loops.Done(); w.keepaliveLoop(stop) }()
	go func() { defer loops.Done(); w.lingerLoop(stop) }()
	if w.sleep != nil {
		loops.Add(1)
		go func() { defer loops.Done(); w.sleep.loop(stop) }()
	}

	<-ctx.Done()
	w.takeMu.Lock()
	w.serving = false
	w.takeMu.Unlock()
	w.Drain()
	w.sw.close()
	// Stop taking requests at once; a request already forwarded to us is
	// bounced back to its dispatcher by onRequest.
	_ = subs[0].Unsubscribe()
	w.waitInflight(w.cfg.DrainTimeout)
	close(stop)
	loops.Wait()
	w.publishHeartbeat() // last beat: draining, running 0
	return w.nc.Flush()
}

func (w *Worker) waitInflight(timeout time.Duration) {
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(timeout):
	}
	w.mu.Lock()
	n := len(w.inflight)
	for _, c := range w.inflight {
		c.cancel(errShutdown)
	}
	w.mu.Unlock()
	w.log.Warn("drain timeout: cancelled in-flight requests", "count", n)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		w.log.Error("in-flight requests did not end after cancel")
	}
}

var errShutdown = schemas.ErrShuttingDown.New("worker")

// Take does for m what a request on the worker's work subject does, for a
// request a dispatcher in this process (dev) hands over in memory
// (dispatcher.LocalWorkers); false, and m not taken, when the worker is not
// taking requests (not yet running, or stopping): the bus then answers for
// it. It never blocks.
func (w *Worker) Take(m *nats.Msg) bool {
	w.takeMu.RLock()
	defer w.takeMu.RUnlock()
	if !w.serving {
		return false
	}
	w.onRequest(m)
	return true
}

func (w *Worker) onRequest(m *nats.Msg) { w.take(m, false) }

// onPrefill takes the prefill of another worker's disaggregated request
// (disagg.go): a request like any other, whose kv_transfer_params are kept.
func (w *Worker) onPrefill(m *nats.Msg) { w.take(m, true) }

func (w *Worker) take(m *nats.Msg, prefill bool) {
	if m.Reply == "" {
		return // nobody to answer
	}
	if w.draining.Load() || !w.admit() {
		w.bounce(m)
		return
	}
	if w.sw.active.Load() { // switching models (switch.go): after admit, see switcher.active
		w.running.Add(-1)
		w.bounce(m)
		return
	}
	c, err := w.newCall(m, prefill)
	if err != nil {
		c.sendError(schemas.AsError(err))
		c.record("error", err, nil)
		w.finish(c) // the slot, the context's timer, the done notice that frees the dispatcher's count
		return
	}
	w.wg.Add(1)
	w.runs.Go(func() { w.serve(c) })
}

// admit takes one slot of the hard cap, or reports that there is none.
func (w *Worker) admit() bool {
	for {
		n := w.running.Load()
		if n >= int64(w.cfg.MaxConcurrency) {
			return false
		}
		if w.running.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// bounce hands a request we cannot take back to the dispatcher that sent it,
// or, when it came straight from a client, answers 503.
func (w *Worker) bounce(m *nats.Msg) {
	w.m.requests.WithLabelValues("bounced").Inc()
	draining, switching := w.draining.Load(), w.sw.target()
	reason := "full"
	if draining {
		reason = "draining"
	} else if switching != "" {
		reason = "switching"
	}
	span := w.bounceSpan(m, reason)
	defer span.End()
	if b := m.Header.Get(schemas.HdrBounce); b != "" {
		fwd := &nats.Msg{Subject: b, Reply: m.Reply, Header: m.Header, Data: m.Data}
		if err := w.nc.PublishMsg(fwd); err == nil {
			return
		}
	}
	e := schemas.ErrWorkerBusy.New(w.cfg.ID)
	if draining {
		e = errShutdown
	} else if switching != "" {
		e = schemas.ErrWorkerSwitching.New(w.cfg.ID, switching)
	}
	tracing.Fail(span, e)
	_ = w.nc.Publish(m.Reply, schemas.AppendFrame(nil, schemas.FrameError, 0, e.Payload()))
}

// onCancel aborts a request: the body is schemas.CancelBody, the request id
// and its cancel token (which only its requester has). A cancel with a wrong
// or missing token, or for a request not running here, is ignored and counted.
func (w *Worker) onCancel(m *nats.Msg) {
	id, token := schemas.ParseCancel(m.Data)
	w.mu.Lock()
	c := w.inflight[inflightKey(id, token)]
	w.mu.Unlock()
	if c != nil && schemas.CancelTokenMatches(c.cancelToken, token) {
		c.cancel(context.Canceled)
		return
	}
	w.m.cancelsIgnored.Inc()
}

func (w *Worker) serve(c *call) {
	defer w.wg.Done()
	defer w.finish(c)
	c.sendAccepted()
	// A sleeping engine is woken first (sleep.go), then a LoRA adapter the
	// engine lacks is loaded; the stream gets keepalives meanwhile.
	err := w.sleep.awaken(c.ctx)
	var release func()
	if err == nil {
		release, err = w.adapters.Acquire(c.ctx, c.req.Model, c.adapterBase, c.adapterPath)
	}
	var res *engine.Result
	if err == nil {
		w.prefillRemote(c) // a disaggregated request's prefill, on its prefill worker (disagg.go)
		res, err = w.eng.Generate(c.ctx, &c.req, c)
		if err != nil && w.decodeRefused(c, err) {
			res, err = w.eng.Generate(c.ctx, &c.req, c)
		}
		// The engine is done with the adapter. It is released before the
		// last frame: a client that sends its next request as soon as it
		// has this one's end must find the adapter no longer in use, or a
		// load that must evict would pass over it and evict a hotter one
		// (integration TestAdapterEvictionByDemand on a loaded machine).
		release()
	}
	if err != nil {
		if cause := context.Cause(c.ctx); cause != nil && c.ctx.Err() != nil {
			err = cause
		}
		if c.remote != nil && !c.remote.counted { // failed on transferred KV before its first chunk
			c.remote.counted = true
			tracing.Fail(c.remote.span, err)
			c.remote.span.End()
		}
		if c.prefillFor {
			w.m.disagg.served.WithLabelValues(servedOutcome(err)).Inc()
		}
		if errors.Is(err, context.Canceled) {
			w.m.requests.WithLabelValues("cancelled").Inc()
			c.record("cancelled", nil, nil)
			return // the client is gone: nobody to tell
		}
		w.m.requests.WithLabelValues("error").Inc()
		e := schemas.AsError(err)
		// The done notice (failed) goes out before the error frame: a
		// client that sends the request again at once (a retry, a
		// migration) must find its dispatcher told already, or a tenant's
		// request would count twice against its key.
		w.release(c)
		c.sendError(e)
		c.record("error", e, nil)
		return
	}
	w.m.requests.WithLabelValues("ok").Inc()
	w.m.e2e.Observe(time.Since(c.start).Seconds())
	if c.prefillFor {
		w.m.disagg.served.WithLabelValues("ok").Inc()
	}
	c.remoteFirstChunk() // a non-streaming request on transferred KV has no chunk
	payload := res.Response
	if payload == nil {
		var buf [256]byte
		payload = schemas.AppendDoneInfo(buf[:0], &res.Usage)
	}
	c.send(schemas.FrameDone, payload)
	c.completed = true
	c.used = res.Usage
	c.record("done", nil, res)
	c.recordUsage(res)
}

func (w *Worker) finish(c *call) {
	c.span.End() // after the last frame
	c.cancel(nil)
	w.release(c)
}

// release frees c's slot and publishes its done notice, once: from finish,
// or before the error frame of a failed call (serve).
func (w *Worker) release(c *call) {
	if c.released {
		return
	}
	c.released = true
	w.mu.Lock()
	if w.inflight[c.key()] == c { // a call refused as a duplicate is not the one running
		delete(w.inflight, c.key())
	}
	w.mu.Unlock()
	n := w.running.Add(-1)
	if n == 0 {
		w.sleep.idle()
	}
	var buf [256]byte
	b := schemas.AppendDoneNotice(buf[:0], schemas.DoneNotice{Worker: w.cfg.ID, RequestID: c.req.ID, Running: int(n),
		Failed: !c.completed, PromptTokens: c.used.PromptTokens, CompletionTokens: c.used.CompletionTokens,
		PrefillMS: float64(c.prefill.Microseconds()) / 1000, HeldMS: float64(time.Since(c.start).Microseconds()) / 1000})
	_ = w.nc.Publish(w.doneSubject, b)
}
