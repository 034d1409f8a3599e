package workers

import (
	"encoding/json"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// kvEventsEvery is how often a worker publishes its engine's prefix-cache
// events: often enough that a prompt's next request, a few hundred
// milliseconds later, finds it known to every dispatcher; rarely enough
// that a busy engine's events go out in batches.
const kvEventsEvery = 50 * time.Millisecond

// kvEventsLoop publishes the engine's KV events (engine.KVEventer) on
// schemas.KVEventsSubject until stop closes; an engine that reports none
// (KVEventsOn false) makes it return at once.
func (w *Worker) kvEventsLoop(stop <-chan struct{}) {
	kv, ok := w.eng.(engine.KVEventer)
	if !ok || !kv.KVEventsOn() {
		return
	}
	t := time.NewTicker(kvEventsEvery)
	defer t.Stop()
	subject := schemas.KVEventsSubject(w.cfg.ID)
	var seq uint64
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ev, ok := kv.DrainKVEvents()
		if !ok {
			continue
		}
		seq++
		ev.Worker, ev.Seq = w.cfg.ID, seq
		b, err := json.Marshal(ev)
		if err != nil {
			continue
		}
		if err := w.nc.Publish(subject, b); err != nil {
			w.log.Debug("kv events not published", "err", err)
		}
	}
}
