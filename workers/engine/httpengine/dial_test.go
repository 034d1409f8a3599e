package httpengine

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// At most the limit of connects run at once; the others wait their turn
// and all connect in the end.
func TestDialerBoundsConnectsInFlight(t *testing.T) {
	var now, peak atomic.Int32
	release := make(chan struct{})
	d := &dialer{slots: make(chan struct{}, 3), timeout: 10 * time.Second,
		dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			n := now.Add(1)
			defer now.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-release
			c1, c2 := net.Pipe()
			c2.Close()
			return c1, nil
		}}
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.DialContext(context.Background(), "tcp", "engine:1")
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for now.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling a condition, not waiting for time to pass
	}
	if got := now.Load(); got != 3 {
		t.Fatalf("%d connects in flight, want 3", got)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if p := peak.Load(); p != 3 {
		t.Fatalf("peak %d connects in flight, want 3", p)
	}
}

// A connect that cannot get a turn within the timeout fails as a dial
// error, not a hang.
func TestDialerWaitIsBounded(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	d := &dialer{slots: make(chan struct{}, 1), timeout: 50 * time.Millisecond,
		dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			select {
			case <-block:
			case <-time.After(time.Minute):
			}
			return nil, errors.New("released")
		}}
	go d.DialContext(context.Background(), "tcp", "engine:1") // holds the one turn
	for len(d.slots) == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	_, err := d.DialContext(context.Background(), "tcp", "engine:1")
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a dial error wrapping the deadline", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("waited %s for a turn, want about 50ms", waited)
	}
}
