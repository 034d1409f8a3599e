package dispatcher

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// failures remembers for a while the requests whose last attempt a worker
// ended without its done frame (DoneNotice.Failed: an error, a broken
// engine stream), by request id and worker. A tenant's request sent again
// naming that worker in Tb-Exclude is then the same request (counted once
// against its key's limits); sent again after an attempt that succeeded, or
// excluding a worker that neither failed it nor is gone, it is a new one.
type failures struct {
	mu    sync.Mutex
	byID  map[string]failure
	order []recorded // in the order recorded, to forget the oldest first
	// changed is closed (and replaced) at each failure recorded: await's
	// wake-up. waiting: an await is under way (at most one at a time).
	changed chan struct{}
	waiting atomic.Bool
}

type recorded struct {
	id string
	at time.Time
}

type failure struct {
	worker string
	at     time.Time
}

// Bounds: a resend follows its failure within seconds (the client's
// backoff); the map holds at most maxFailures ids (~100 bytes each).
const (
	failureTTL  = 5 * time.Minute
	maxFailures = 100_000
)

// record takes a done notice: a failed attempt is remembered, a finished
// one forgotten.
func (f *failures) record(n schemas.DoneNotice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !n.Failed {
		delete(f.byID, n.RequestID)
		return
	}
	if f.byID == nil {
		f.byID = map[string]failure{}
	}
	// The oldest first, while full (order also holds ids forgotten since,
	// or recorded again: those entries only leave order).
	for len(f.order) > 0 && (len(f.byID) >= maxFailures || len(f.order) >= 2*maxFailures) {
		old := f.order[0]
		f.order = f.order[1:]
		if e, ok := f.byID[old.id]; ok && e.at.Equal(old.at) {
			delete(f.byID, old.id)
		}
	}
	now := time.Now()
	f.byID[n.RequestID] = failure{worker: n.Worker, at: now}
	f.order = append(f.order, recorded{n.RequestID, now})
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// await waits up to d for failedOn(id, exclude) to become true, and says
// whether it did. Only one await runs at a time: another returns false at
// once.
func (f *failures) await(id, exclude string, d time.Duration) bool {
	if !f.waiting.CompareAndSwap(false, true) {
		return false
	}
	defer f.waiting.Store(false)
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		e, ok := f.byID[id]
		if ok && time.Since(e.at) < failureTTL && schemas.ExcludeHas(exclude, e.worker) {
			f.mu.Unlock()
			return true
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// failedOn reports whether request id's last attempt failed, recently, on a
// worker the comma-separated exclude list names.
func (f *failures) failedOn(id, exclude string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.byID[id]
	return ok && time.Since(e.at) < failureTTL && schemas.ExcludeHas(exclude, e.worker)
}
