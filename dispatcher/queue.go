package dispatcher

import (
	"container/heap"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

// queued is one request waiting for a worker.
type queued struct {
	msg      *nats.Msg
	id       string // queueKey: request id and cancel token
	model    string
	priority int
	seq      uint64
	enqueued time.Time
	expires  time.Time // queue timeout or the request's deadline, whichever is first
	adapter  *adapterRef
	hashes   []uint64   // the prompt's block hashes (request.hashes)
	text     int        // request.text
	span     trace.Span // the dispatch span, ended when the request leaves the queue
	index    int        // in the heap; -1 once removed
}

// modelQueue is a bounded priority queue: lower priority value first, FIFO
// within a priority.
type modelQueue []*queued

func (q modelQueue) Len() int { return len(q) }
func (q modelQueue) Less(i, j int) bool {
	if q[i].priority != q[j].priority {
		return q[i].priority < q[j].priority
	}
	return q[i].seq < q[j].seq
}
func (q modelQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}
func (q *modelQueue) Push(x any) {
	e := x.(*queued)
	e.index = len(*q)
	*q = append(*q, e)
}
func (q *modelQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.index = -1
	return e
}

func (q *modelQueue) push(e *queued) { heap.Push(q, e) }
func (q *modelQueue) pop() *queued   { return heap.Pop(q).(*queued) }
func (q *modelQueue) remove(e *queued) {
	if e.index >= 0 {
		heap.Remove(q, e.index)
	}
}
