package workers

import (
	"errors"
	"sync"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// outbox batches the frames of every stream going to one client inbox prefix
// (one gateway) into multiplexed messages (schemas.HdrMux). A frame goes out
// at once when it is a stream's first chunk (time to first token is never
// traded), or when the outbox has been quiet for ChunkLinger and its last
// message carried one frame (a lone stream pays no linger); otherwise it
// waits, at most ChunkLinger, for the frames of other streams. With a real
// model's pace and several streams that means one message per engine step:
// after a message of several frames, the next step's first token waits for
// the rest of its step instead of going alone (one message fewer per step,
// which on a small machine is tens of microseconds of CPU in each of the
// worker, the NATS server and the gateway).
type outbox struct {
	w       *Worker
	subject string // <prefix>_mux

	mu        sync.Mutex
	body      []byte // entries so far
	n         int    // entries in body
	single    string // reply subject of the first entry (sent plain when alone)
	singleAt  int    // offset of the first entry's frame in body
	last      time.Time
	lastN     int // frames in the last message sent
	lingering bool
	used      time.Time // last add, to forget idle outboxes
}

// outboxFor returns the outbox of a reply prefix, creating it.
func (w *Worker) outboxFor(prefix string) *outbox {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	ob := w.outboxes[prefix]
	if ob == nil {
		ob = &outbox{w: w, subject: prefix + schemas.MuxToken}
		w.outboxes[prefix] = ob
	}
	return ob
}

// add queues one frame for the stream whose reply subject is reply (token
// its last token), at now. The frame is copied.
func (ob *outbox) add(reply, token string, frame []byte, urgent bool, now time.Time) error {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	ob.used = now
	// One message stays under the server's max_payload: a frame that would
	// take the batch past it sends the batch first (frames themselves are
	// split to fit, see call.publishLocked).
	var early error
	if ob.n > 0 && int64(len(ob.body)+len(frame)) > ob.w.partSize.Load() {
		early = ob.flushLocked(now)
	}
	if ob.n == 0 {
		ob.single = reply
	}
	ob.body = schemas.AppendMuxEntry(ob.body, token, frame)
	if ob.n == 0 {
		ob.singleAt = len(ob.body) - len(frame)
	}
	ob.n++
	if urgent || ob.quiet(now) || len(ob.body) >= maxPending {
		return errors.Join(early, ob.flushLocked(now))
	}
	if !ob.lingering {
		ob.lingering = true
		ob.w.linger(ob)
	}
	return early
}

func (ob *outbox) flushLocked(now time.Time) error {
	if ob.n == 0 {
		return nil
	}
	var err error
	if ob.n == 1 {
		err = ob.w.nc.Publish(ob.single, ob.body[ob.singleAt:])
	} else {
		err = ob.w.nc.Publish(ob.subject, ob.body)
	}
	ob.body, ob.lastN, ob.n, ob.single, ob.last = ob.body[:0], ob.n, 0, "", now
	return err
}

// burstGap: a message of several frames sent less than this long ago means
// streams are running together (engine steps come faster than this).
const burstGap = 100 * time.Millisecond

// quiet reports whether a frame added at now may go at once: the outbox has
// sent nothing for ChunkLinger, and not because streams are between two
// engine steps (see outbox).
func (ob *outbox) quiet(now time.Time) bool {
	linger, since := ob.w.cfg.ChunkLinger, now.Sub(ob.last)
	return linger <= 0 || since >= linger && (ob.lastN < 2 || since >= burstGap)
}

// flushLinger is the linger timer firing for ob.
func (ob *outbox) flushLinger() {
	ob.mu.Lock()
	ob.lingering = false
	if err := ob.flushLocked(time.Now()); err != nil {
		// The frames of several streams are lost: their clients see the
		// gap at the next frame, or the stall; count it.
		ob.w.m.publishErrors.Inc()
		ob.w.log.Warn("multiplexed reply not sent", "subject", ob.subject, "err", err)
	}
	ob.mu.Unlock()
}

// forgetIdleOutboxes drops the outboxes of clients not heard of for a while
// (a gateway that restarted has a new inbox prefix); the keepalive loop calls
// it once a minute.
func (w *Worker) forgetIdleOutboxes(now time.Time) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	for prefix, ob := range w.outboxes {
		ob.mu.Lock()
		idle := ob.n == 0 && now.Sub(ob.used) > time.Minute
		ob.mu.Unlock()
		if idle {
			delete(w.outboxes, prefix)
		}
	}
}
