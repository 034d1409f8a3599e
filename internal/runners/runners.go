package runners

import "time"

// Runners hands functions to idle goroutines, starting one when none is
// idle. A goroutine idle for longer than the idle time ends, so a burst
// leaves none behind for long. The number of goroutines is the number of
// functions running at once (plus those idle): bound it where the functions
// come from.
type Runners struct {
	work chan func()
	idle time.Duration
}

// New returns Runners whose goroutines wait idle up to idle for work.
func New(idle time.Duration) *Runners {
	return &Runners{work: make(chan func()), idle: idle}
}

// Go runs f on an idle goroutine, or on a new one.
func (r *Runners) Go(f func()) {
	select {
	case r.work <- f: // an idle goroutine took it
	default:
		go r.loop(f)
	}
}

func (r *Runners) loop(f func()) {
	t := time.NewTimer(r.idle)
	defer t.Stop()
	for {
		f()
		f = nil // let f's captures go while idle
		t.Reset(r.idle)
		select {
		case f = <-r.work:
		case <-t.C:
			return
		}
	}
}
