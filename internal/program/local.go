package program

import (
	"sync/atomic"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/workers"
)

// localReplies is dev's gateway client, which dev's workers hand their reply
// frames to in memory (workers.LocalReplies). The gateway starts after the
// workers: until it has a client, every frame goes on the bus.
type localReplies struct{ cl atomic.Pointer[client.Client] }

func (l *localReplies) Receiver(prefix string) workers.Receiver {
	if cl := l.cl.Load(); cl != nil && cl.Prefix() == prefix {
		return cl
	}
	return nil
}
