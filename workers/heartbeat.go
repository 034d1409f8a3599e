package workers

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func (w *Worker) beatSoon() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *Worker) heartbeatLoop(stop <-chan struct{}) {
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	// The served models can change between beats (an HTTP engine's list
	// refreshes, an adapter loads): beat at once when they do. Engines that
	// tell (engine.ModelsNotifier) and the adapter manager wake us; any
	// other engine is polled.
	var check <-chan time.Time
	if n, ok := w.eng.(engine.ModelsNotifier); ok {
		n.NotifyModels(w.beatSoon)
	} else {
		poll := time.NewTicker(100 * time.Millisecond)
		defer poll.Stop()
		check = poll.C
	}
	models := w.publishHeartbeat()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-w.wake:
		case <-check:
			if now := w.eng.Models(); !slices.Equal(now, models) {
				models = now
				break
			}
			continue
		}
		models = w.publishHeartbeat()
	}
}

// Heartbeat is the worker's current state as it advertises it.
func (w *Worker) Heartbeat() schemas.Heartbeat {
	st := w.eng.Stats()
	healthy := w.health()
	var lens map[string]int
	if cl, ok := w.eng.(engine.ContextLengths); ok {
		lens = cl.MaxModelLens()
	}
	hb := schemas.Heartbeat{
		MaxModelLen:    lens,
		Worker:         w.cfg.ID,
		Models:         w.eng.Models(),
		Adapters:       st.Adapters,
		Loading:        w.adapters.Loading(),
		InUse:          w.adapters.InUse(),
		MaxLoras:       st.MaxLoras,
		MaxConcurrency: w.cfg.MaxConcurrency,
		Running:        w.Running(),
		Waiting:        st.Waiting,
		KVCacheUsage:   st.KVCacheUsage,
		KVCacheTokens:  st.KVTokens,
		Draining:       w.draining.Load(),
		Healthy:        healthy,
		Engine:         w.eng.Name(),
		Version:        w.cfg.Version,
		IntervalMS:     int(w.cfg.HeartbeatInterval / time.Millisecond),
		Seq:            w.hbSeq.Add(1),
		Role:           w.cfg.Role,
	}
	w.sw.beat(&hb)
	w.sleep.report(&hb)
	return hb
}

// healthEvery bounds how often a heartbeat asks the engine for its health:
// beats come every 250ms, the engine is asked at most once a second and the
// last answer is repeated in between. (The HTTP engines answer from a cached
// verdict, judged from their requests' outcomes and idle probes: see
// httpengine.)
const healthEvery = time.Second

func (w *Worker) health() bool {
	w.healthMu.Lock()
	defer w.healthMu.Unlock()
	if now := time.Now(); w.healthAt.IsZero() || now.Sub(w.healthAt) >= healthEvery {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		w.healthy = w.eng.Health(ctx) == nil
		cancel()
		w.healthAt = now
	}
	return w.healthy
}

// frameHeadroom is what a message needs besides a frame's payload: the frame
// header and a mux entry's header.
const frameHeadroom = 1 << 10

// setPartSize sets the largest frame payload from the server's max_payload.
func (w *Worker) setPartSize(maxPayload int64) {
	w.partSize.Store(max(maxPayload-frameHeadroom, frameHeadroom))
}

// publishHeartbeat sends one heartbeat and returns the models it listed.
func (w *Worker) publishHeartbeat() []string {
	hb := w.Heartbeat()
	b, _ := json.Marshal(hb)
	if err := w.nc.Publish(schemas.HeartbeatSubject(w.cfg.ID), b); err != nil {
		w.log.Warn("heartbeat not sent", "err", err)
	}
	return hb.Models
}

// keepaliveLoop sends keepalives on streams that have been silent (long
// prefill, queued in the engine), so the client tells a slow worker from a
// dead one. One ticker for all streams, not a timer per stream.
func (w *Worker) keepaliveLoop(stop <-chan struct{}) {
	t := time.NewTicker(min(w.cfg.KeepaliveInterval, prefillKeepalive) / 2)
	defer t.Stop()
	var calls []*call
	lastForget := time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if now.Sub(lastForget) > time.Minute {
				lastForget = now
				w.forgetIdleOutboxes(now)
			}
			calls = calls[:0]
			w.mu.Lock()
			for _, c := range w.inflight {
				calls = append(calls, c)
			}
			w.mu.Unlock()
			for _, c := range calls {
				d := w.cfg.KeepaliveInterval
				if c.prefillFor { // its decode worker tells a dead prefill worker by silence (disagg.go)
					d = prefillKeepalive
				}
				c.keepalive(now, d)
			}
		}
	}
}

// onControl answers request/reply control operations.
func (w *Worker) onControl(m *nats.Msg) {
	op := m.Subject[len(schemas.CtlPrefix)+len(w.cfg.ID)+1:]
	reply := func(err error) {
		if m.Reply == "" {
			return
		}
		r := schemas.CtlReply{OK: err == nil}
		if err != nil {
			r.Error = schemas.AsError(err)
		}
		b, _ := json.Marshal(r)
		_ = m.Respond(b)
	}
	switch op {
	case schemas.CtlPing:
		reply(nil)
	case schemas.CtlDrain:
		w.Drain()
		reply(nil)
	case schemas.CtlSwitch:
		w.onSwitch(m, reply)
	case schemas.CtlLoadAdapter, schemas.CtlUnloadAdapter:
		if !w.adapters.CanLoad() {
			reply(schemas.ErrAdaptersUnsupported.New(w.eng.Name()))
			return
		}
		var req schemas.AdapterRequest
		if err := json.Unmarshal(m.Data, &req); err != nil || req.Name == "" {
			reply(schemas.ErrAdapterName.At("name"))
			return
		}
		// Loading takes a while: never block the control subscription. Both
		// go through the adapter manager, which coalesces them with the
		// loads requests cause and makes room by eviction.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.AdapterLoadTimeout+w.cfg.AdapterUnloadGrace)
			defer cancel()
			// A sleeping engine is woken for it (sleep.go), and kept awake.
			awake, err := w.sleep.hold(ctx)
			if err == nil {
				if op == schemas.CtlLoadAdapter {
					err = w.adapters.Load(ctx, req.Name, req.Base, req.Path)
				} else {
					err = w.adapters.Unload(ctx, req.Name)
				}
				awake()
			}
			reply(err)
			w.beatSoon()
		}()
	default:
		reply(schemas.ErrUnknownControl.New(op))
	}
}
