package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Sleep mode, as vLLM's level 1 (engine.Sleeper): Sleep takes SleepTime and
// drops the prefix cache (vLLM frees its KV cache: what it held is gone,
// and its KV events say so), WakeUp takes WakeTime. From the start of Sleep
// to the end of WakeUp every request that needs the model (generation,
// embeddings; not tokenize) fails with a 503 ErrEngineAsleep. A sleep with
// requests running is refused (vLLM's default aborts them): the worker
// sleeps only an idle engine, and a test that breaks that rule should fail
// loudly rather than lose requests.

// Sleep puts the engine to sleep; asleep already, it does nothing. Cut
// short by ctx, the engine is asleep all the same (as vLLM, which goes on
// when its client hangs up): Sleeping says so.
func (e *Engine) Sleep(ctx context.Context) error {
	e.sleepMu.Lock()
	defer e.sleepMu.Unlock()
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return e.errClosed()
	case e.asleep:
		e.mu.Unlock()
		return nil
	case e.active > 0:
		n := e.active
		e.mu.Unlock()
		return schemas.ErrEngineUnhealthy.New("sim", "this worker", fmt.Sprintf("cannot sleep with requests running (%d)", n))
	}
	e.asleep = true
	e.mu.Unlock()
	// The scheduler drops the cache before the sleep ends: nothing runs, so
	// it does at once, and a wake-up cannot come first.
	dropped := make(chan struct{})
	e.resetKV.Store(&dropped)
	e.signal()
	select {
	case <-dropped:
	case <-e.exit:
		return e.errClosed()
	case <-ctx.Done():
		return ctx.Err()
	}
	return e.pause(ctx, e.cfg.SleepTime)
}

// WakeUp wakes the engine, taking WakeTime; awake already, it does
// nothing. Cut short by ctx, the engine stays asleep.
func (e *Engine) WakeUp(ctx context.Context) error {
	e.sleepMu.Lock()
	defer e.sleepMu.Unlock()
	e.mu.Lock()
	asleep, closed := e.asleep, e.closed
	e.mu.Unlock()
	switch {
	case closed:
		return e.errClosed()
	case !asleep:
		return nil
	}
	if err := e.pause(ctx, e.cfg.WakeTime); err != nil {
		return err
	}
	e.mu.Lock()
	e.asleep = false
	e.mu.Unlock()
	return nil
}

// Sleeping reports whether the engine is asleep, falling asleep or waking.
func (e *Engine) Sleeping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.asleep
}

// pause takes d, unless ctx ends or the engine closes first.
func (e *Engine) pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.quit:
		return e.errClosed()
	}
}

// enter admits a request that needs the model: not while asleep or closed.
func (e *Engine) enter() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return e.errClosed()
	case e.asleep:
		return schemas.ErrEngineAsleep.New("sim")
	}
	e.active++
	return nil
}

// leave ends what enter began.
func (e *Engine) leave() {
	e.mu.Lock()
	e.active--
	e.mu.Unlock()
}

// dropCache empties the prefix cache, as a sleep frees vLLM's KV cache,
// and tells the readers of the sim's KV events that what they knew is
// gone. Scheduler goroutine only, with nothing running or waiting.
func (e *Engine) dropCache() {
	kv := newKVCache(e.cfg.NumBlocks)
	kv.evicted, kv.evictedHash = e.kv.evicted, e.kv.evictedHash
	e.kv = kv
	e.kvx.dropHolds() // the blocks held for decode engines are gone too
	e.kvEv.flush()
	e.kvEv.lose()
	e.blockEv.flush()
	e.blockEv.clearAll()
	e.publishKV()
}
