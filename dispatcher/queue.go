package dispatcher

import (
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/scheduler"
)

// queued is one request waiting for a worker. Its place in line is the
// scheduler's (flow control: package scheduler, docs/scheduling.md); item
// is its entry there, and item.Value points back here.
type queued struct {
	msg     *nats.Msg
	id      string // queueKey: request id and cancel token
	reqID   string
	model   string
	adapter *adapterRef
	hashes  []uint64   // the prompt's block hashes (request.hashes)
	text    int        // request.text
	span    trace.Span // the dispatch span, ended when the request leaves the queue
	item    scheduler.Item
	cold    bool      // queued while no live worker served its model (hold.go)
	beatAt  time.Time // its last queued frame (hold.go)
}

func (e *queued) enqueued() time.Time { return e.item.Enqueued() }
