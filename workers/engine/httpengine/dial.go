package httpengine

import (
	"context"
	"fmt"
	"net"
	"time"
)

// maxDialing bounds the connects in flight to one engine. 10,000 streams
// starting within a second made 10,000 connects at once, past the listen
// backlog of the engine's socket (2,048 SYNs on the test machine): some
// connects then timed out after 5 s and their requests failed. In waves of
// 256 they all connect; a connect takes well under a millisecond locally.
const maxDialing = 256

// dialer connects with at most cap(slots) connects in flight; the wait for
// a turn and the connect together take at most timeout.
type dialer struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	slots   chan struct{}
	timeout time.Duration
}

func newDialer(timeout time.Duration, inFlight int) *dialer {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return &dialer{dial: d.DialContext, slots: make(chan struct{}, inFlight), timeout: timeout}
}

// DialContext is http.Transport's DialContext.
func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.timeout)
		defer cancel()
	}
	select {
	case d.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, &net.OpError{Op: "dial", Net: network,
			Err: fmt.Errorf("waiting for a turn among %d connects in flight: %w", cap(d.slots), context.Cause(ctx))}
	}
	defer func() { <-d.slots }()
	return d.dial(ctx, network, addr)
}
