package program

import (
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/workers"
)

// inProcess is what dev's programs hand each other in memory instead of
// through the embedded NATS server: requests from the dispatcher to the
// workers (dispatcher.LocalWorkers) and reply frames from the workers to the
// gateway's client (workers.LocalReplies). The gateway starts after the
// workers: until it has a client, every frame goes on the bus.
type inProcess struct {
	cl      atomic.Pointer[client.Client]
	workers sync.Map // worker id → *workers.Worker
}

func (l *inProcess) addWorker(id string, w *workers.Worker) { l.workers.Store(id, w) }

func (l *inProcess) Take(worker string, m *nats.Msg) bool {
	w, ok := l.workers.Load(worker)
	return ok && w.(*workers.Worker).Take(m)
}

func (l *inProcess) Receiver(prefix string) workers.Receiver {
	if cl := l.cl.Load(); cl != nil && cl.Prefix() == prefix {
		return cl
	}
	return nil
}
