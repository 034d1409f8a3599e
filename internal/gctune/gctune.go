package gctune

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Policy bounds the collector's GOGC: Headroom is the heap growth past the
// live data to aim at, within [MinPercent, MaxPercent] of it.
type Policy struct {
	Headroom               uint64 // bytes
	MinPercent, MaxPercent int
}

// Default aims at 64 MiB of headroom, with GOGC between 100 (Go's default,
// from a live heap of 64 MiB up) and 400 (at 16 MiB and below).
var Default = Policy{Headroom: 64 << 20, MinPercent: 100, MaxPercent: 400}

// Percent is the GOGC for a live heap of live bytes.
func (p Policy) Percent(live uint64) int {
	if live == 0 {
		return p.MaxPercent
	}
	pct := p.Headroom * 100 / live
	return int(min(max(pct, uint64(p.MinPercent)), uint64(p.MaxPercent)))
}

var (
	once   sync.Once
	active *tuner // the process's, once started
)

// Start applies p from now on, for the life of the process, unless GOGC or
// GOMEMLIMIT is set in the environment: an operator's choice wins. Calls
// after the first do nothing.
func Start(p Policy) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	once.Do(func() {
		active = &tuner{p: p, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
		active.set(p.MaxPercent) // until the first collection measures the live heap
		active.arm()
	})
}

type tuner struct {
	p       Policy
	sample  []metrics.Sample // used by tune only, which runs on the finalizer goroutine
	percent atomic.Int64     // the GOGC set last
}

// arm runs tune after the next collection: a finalizer on an object that
// nothing references runs once a collection has found it unreachable.
func (t *tuner) arm() {
	sentinel := new([16]byte) // not a tiny object: tiny allocations share blocks and may never be freed
	runtime.SetFinalizer(sentinel, func(*[16]byte) { t.tune() })
}

func (t *tuner) tune() {
	metrics.Read(t.sample)
	if v := t.sample[0].Value; v.Kind() == metrics.KindUint64 {
		pct, cur := t.p.Percent(v.Uint64()), int(t.percent.Load())
		// Only a real change: each call recomputes the collector's pacing.
		if d := pct - cur; d*10 > cur || -d*10 > cur {
			t.set(pct)
		}
	}
	t.arm()
}

func (t *tuner) set(pct int) {
	t.percent.Store(int64(pct))
	debug.SetGCPercent(pct)
}
