package fleet

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

// expireEvery is how often Watch forgets silent workers (a dispatcher's
// default sweep period): with workers' 250ms heartbeats and 3 missed beats, a
// dead worker is gone within about 850ms.
const expireEvery = 100 * time.Millisecond

// Watch keeps f up to date from the heartbeats and done notices on nc, and
// forgets silent workers, until ctx ends. Gateways without an embedded
// dispatcher use it; a dispatcher feeds its own Fleet from the subscriptions
// it needs anyway (it drains its queues on the same messages).
func Watch(ctx context.Context, nc *nats.Conn, f *Fleet) error {
	hb, err := nc.Subscribe(schemas.HeartbeatPrefix+"*", func(m *nats.Msg) {
		f.Heartbeat(m.Data, time.Now())
	})
	if err != nil {
		return err
	}
	done, err := nc.Subscribe(schemas.DonePrefix+"*", func(m *nats.Msg) {
		f.Done(m.Data)
	})
	if err != nil {
		_ = hb.Unsubscribe()
		return err
	}
	go func() {
		tick := time.NewTicker(expireEvery)
		defer tick.Stop()
		defer hb.Unsubscribe()
		defer done.Unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if !nc.IsConnected() {
					f.Blind(now) // we are deaf, not they dead
					continue
				}
				f.Expire(now)
			}
		}
	}()
	return nil
}
