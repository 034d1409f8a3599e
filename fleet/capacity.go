package fleet

import (
	"slices"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Capacity on demand (docs/capacity.md): workers that can switch to a model
// they have not loaded, and workers asleep.

// Switchable counts the live, healthy, non-draining workers that list model
// in CanServe without serving it now: capacity a model switch away.
func (f *Fleet) Switchable(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if w.hb.Draining || !w.hb.Healthy || w.prefillOnly() {
			continue
		}
		if _, serves := w.models[model]; serves {
			continue
		}
		for _, m := range w.hb.CanServe {
			if m == model {
				n++
				break
			}
		}
	}
	return n
}

// Asleep counts the live workers serving model whose engine sleeps:
// capacity a wake-up away.
func (f *Fleet) Asleep(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if _, serves := w.models[model]; serves && w.hb.Sleeping && !w.hb.Draining && !w.prefillOnly() {
			n++
		}
	}
	return n
}

// switching reports whether w is switching models (Heartbeat.Switching):
// it takes no new request (it would bounce it) until a heartbeat lists the
// new model; it still counts as serving its old models, whose requests
// wait in the queue meanwhile.
func (w *workerState) switching() bool { return w.hb.Switching != "" }

// SwitchingTo counts the live workers switching to model.
func (f *Fleet) SwitchingTo(model string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, w := range f.workers {
		if w.hb.Switching == model {
			n++
		}
	}
	return n
}

// Switch is a model switch as the fleet saw it in heartbeats: From is the
// model the worker served (one of its CanServe), To the one it switched
// to. Started is when a heartbeat first said Switching (zero when none
// did: the switch was over within one beat); Ended when one no longer did
// (zero while it goes on); OK that the worker then served To.
type Switch struct {
	Worker  string    `json:"worker"`
	From    string    `json:"from,omitempty"`
	To      string    `json:"to"`
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	OK      bool      `json:"ok"`
}

// switchLogSize bounds the switches a fleet remembers.
const switchLogSize = 32

// switchLog is the recent switches, oldest first.
type switchLog struct {
	list []Switch
}

// observeLocked records what a worker's heartbeat says of its switching,
// against its last one (prev; nil for a worker new to the fleet).
func (l *switchLog) observeLocked(prev *schemas.Heartbeat, hb schemas.Heartbeat, now time.Time) {
	if prev == nil || len(hb.CanServe) == 0 {
		return
	}
	switch {
	case hb.Switching != "" && prev.Switching != hb.Switching:
		l.add(Switch{Worker: hb.Worker, From: loadedOf(*prev), To: hb.Switching, Started: now})
	case hb.Switching == "" && prev.Switching != "":
		to := prev.Switching
		for i := len(l.list) - 1; i >= 0; i-- {
			if s := &l.list[i]; s.Worker == hb.Worker && s.To == to && s.Ended.IsZero() {
				s.Ended, s.OK = now, slices.Contains(hb.Models, to)
				return
			}
		}
		l.add(Switch{Worker: hb.Worker, From: loadedOf(*prev), To: to, Ended: now, OK: slices.Contains(hb.Models, to)})
	case hb.Switching == "" && prev.LoadedAt != 0 && hb.LoadedAt != prev.LoadedAt && loadedOf(*prev) != "" && loadedOf(hb) != loadedOf(*prev):
		// Over between two beats: never seen switching.
		l.add(Switch{Worker: hb.Worker, From: loadedOf(*prev), To: loadedOf(hb), Ended: now, OK: true})
	}
}

func (l *switchLog) add(s Switch) {
	if len(l.list) == switchLogSize {
		l.list = append(l.list[:0], l.list[1:]...)
	}
	l.list = append(l.list, s)
}

// loadedOf is the model among its CanServe that a worker serves ("" none).
func loadedOf(hb schemas.Heartbeat) string {
	for _, m := range hb.Models {
		if slices.Contains(hb.CanServe, m) {
			return m
		}
	}
	return ""
}

// Switches lists the model switches the fleet saw lately (at most 32),
// newest first.
func (f *Fleet) Switches() []Switch {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := slices.Clone(f.switches.list)
	slices.Reverse(out)
	return out
}
