package sim

import (
	"context"
	"fmt"
	"slices"

	"github.com/tokenbus/tokenbus/schemas"
)

// A sim started with Config.Models serves one of them at a time, as a GPU
// that holds one model's weights: Switch loads another (engine.Switcher).

// loaded is the base model served now, under all its names; a switch
// replaces it whole, so readers take one pointer and see one model.
type loaded struct {
	model string
	list  []string        // model, then its other names (Models)
	names map[string]bool // the same, to look up
	lens  map[string]int  // MaxModelLen by name (MaxModelLens: callers must not change it)
	// salt is mixed into the seed of every answer and the root of the
	// prefix cache's block hashes: 0 for a sim of one model (its output as
	// it always was), else a hash of the name, so that two models a sim
	// switches between answer differently and share no cached block.
	salt uint64
}

func (e *Engine) newLoaded(model string) *loaded {
	l := &loaded{model: model, list: []string{model}, names: map[string]bool{model: true}}
	for _, n := range e.cfg.ServedNames {
		if n != "" && !l.names[n] {
			l.names[n] = true
			l.list = append(l.list, n)
		}
	}
	l.lens = make(map[string]int, len(l.list))
	for _, n := range l.list {
		l.lens[n] = e.cfg.MaxModelLen
	}
	if len(e.cfg.Models) > 0 {
		l.salt = schemas.StringHash("model-weights:" + model)
	}
	return l
}

// checkModels checks Models and sets Model to the one loaded at start.
func checkModels(cfg *Config) error {
	if len(cfg.Models) == 0 {
		return nil
	}
	if len(cfg.ServedNames) > 0 {
		return fmt.Errorf("sim: ServedNames goes with one model, not with Models")
	}
	for i, m := range cfg.Models {
		if m == "" || slices.Contains(cfg.Models[:i], m) {
			return fmt.Errorf("sim: Models %q: empty or repeated name", cfg.Models)
		}
	}
	if cfg.Model == "" {
		cfg.Model = cfg.Models[0]
	}
	if !slices.Contains(cfg.Models, cfg.Model) {
		return fmt.Errorf("sim: Model %q is not among Models %q", cfg.Model, cfg.Models)
	}
	cfg.Models = slices.Clone(cfg.Models)
	return nil
}

// CanServe lists the models Switch can load, the loaded one among them; nil
// for a sim of one model (engine.Switcher).
func (e *Engine) CanServe() []string { return slices.Clone(e.cfg.Models) }

// Switch loads model in place of the model served now, taking SwitchTime;
// requests still running finish on the old model (the worker lets them
// finish before it switches). The adapters, made for the old model, are
// unloaded, and an engine asleep wakes with the new model. A switch to the
// model loaded does nothing; one cancelled (ctx) leaves the old model
// served.
func (e *Engine) Switch(ctx context.Context, model string) error {
	if !slices.Contains(e.cfg.Models, model) {
		return schemas.ErrModelNotFound.New(model)
	}
	e.switchMu.Lock()
	defer e.switchMu.Unlock()
	if e.cur.Load().model == model {
		return nil
	}
	if err := e.Health(ctx); err != nil {
		return err
	}
	if err := sleepCtx(ctx, e.cfg.SwitchTime); err != nil {
		return err
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return e.errClosed()
	}
	e.cur.Store(e.newLoaded(model))
	clear(e.adapters)
	e.asleep = false // the new model's weights are loaded: awake (sleep.go)
	e.mu.Unlock()
	e.ModelsChanged()
	return nil
}
