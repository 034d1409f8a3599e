package program

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
)

// errStopped is the error of a part that returned nil while the program was
// still running: a server whose listener closed under it, say. The program
// cannot go on without it.
var errStopped = errors.New("stopped while the program was running")

// life runs the parts of one program and ends them together. Every part is a
// goroutine of one errgroup; the first to fail, or Close, ends the parts'
// context. Then the program's shutdown runs (stopping its servers in order,
// within their bounds), and once every part has returned, its release frees
// what the parts used (connections, stores, engines). Wait returns the first
// error.
type life struct {
	ctx    context.Context // the parts' context: ends on Close or the first failure
	cancel context.CancelFunc
	g      *errgroup.Group
	done   chan struct{} // closed once released
	err    error         // the first error; read after done
	// conn, when set (before the first part), is the NATS connection of a
	// run (rerun.go): a part that stops because nats.go gave it up does not
	// end the run, whose keeper starts the next one and closes this one.
	conn *connWatch
}

func newLife() *life {
	base, cancel := context.WithCancel(context.Background())
	g, ctx := errgroup.WithContext(base)
	return &life{ctx: ctx, cancel: cancel, g: g, done: make(chan struct{})}
}

// part runs run as one part of the program, named in its error. A part runs
// until the program ends: returning earlier, even with nil, ends the program.
func (l *life) part(name string, run func() error) {
	l.g.Go(func() error {
		err := run()
		if l.ctx.Err() == nil && l.conn.given() {
			return nil // its connection is gone; the run's keeper replaces the run
		}
		if err == nil && l.ctx.Err() == nil {
			err = errStopped
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// begin is called once by a program's start, after its last part started
// (or after it failed): it runs shutdown once the parts' context ends, and
// release once every part has returned. When startErr is not nil, the
// program is stopped at once and the error returned; a part that failed
// during the start is reported as itself.
func (l *life) begin(startErr error, shutdown, release func()) error {
	l.g.Go(func() error {
		<-l.ctx.Done()
		shutdown()
		return nil
	})
	go func() {
		err := l.g.Wait()
		release()
		l.err = err
		l.cancel()
		close(l.done)
	}()
	if startErr == nil {
		return nil
	}
	if err := l.Close(); err != nil && errors.Is(startErr, errPartFailed) {
		return err
	}
	return startErr
}

// errPartFailed is what a start returns when a part failed while it waited;
// begin replaces it with that part's error.
var errPartFailed = errors.New("a part of the program failed while it started")

// Wait blocks until the program has ended and everything is released. It
// returns the first error of a part, or nil after a clean Close.
func (l *life) Wait() error {
	<-l.done
	return l.err
}

// Done is closed once the program has ended and everything is released.
func (l *life) Done() <-chan struct{} { return l.done }

// Close stops the program gracefully and returns what Wait returns.
func (l *life) Close() error {
	l.cancel()
	return l.Wait()
}

// waitReady waits until ready is closed: a part has subscribed to its
// subjects. It gives up when the start's ctx ends, when a part fails (then
// begin reports that part's error), or after 10s.
func (l *life) waitReady(ctx context.Context, ready <-chan struct{}, what string) error {
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-l.ctx.Done():
		return errPartFailed
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("%s did not start within 10s", what)
	}
}
