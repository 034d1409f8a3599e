package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Adapters load, serve and unload through engine.Adapters, and Stats lists
// them as the adapter manager (workers/lora) needs: from the moment a load
// returns nil until an unload does. A load bounded by a context that ended
// fails and leaves nothing listed; loading one already loaded and unloading
// one not loaded may fail, with a *schemas.Error (a 404 for the unload).
func testAdapters(t *testing.T, h *Harness) {
	e := start(t, h)
	ad, ok := e.(engine.Adapters)
	if !ok {
		t.Fatalf("%T does not implement engine.Adapters: list Adapters in Harness.Lacks, with the reason", e)
	}
	const name, path = "enginetest-lora", "/adapters/enginetest-lora"
	ctx := t.Context()
	listed := func() bool { return slices.Contains(e.Stats().Adapters, name) }

	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := ad.LoadAdapter(ended, name, path); err == nil || listed() {
		t.Fatalf("a load with its context ended: %v, Stats %+v", err, e.Stats())
	}

	if err := ad.LoadAdapter(ctx, name, path); err != nil {
		t.Fatal(err)
	}
	if !listed() {
		t.Fatalf("loaded, but not in Stats: %+v", e.Stats())
	}
	testenv.WaitFor(t, waitLong, func() error {
		if ms := e.Models(); !slices.Contains(ms, name) {
			return fmt.Errorf("loaded, but not in Models: %q", ms)
		}
		return nil
	})
	for _, kind := range kinds {
		s := newSink()
		res, err := generate(ctx, e, request(t, kind, name, `"stream":true,"stream_options":{"include_usage":true},`+h.short()), s)
		if err != nil {
			t.Fatalf("%s request on the adapter: %v", kind, err)
		}
		checkStream(t, kind, name, 1, s.Lines())
		checkUsage(t, res.Usage, tokens)
	}
	if err := ad.LoadAdapter(ctx, name, path); err != nil && !errors.As(err, new(*schemas.Error)) {
		t.Errorf("a second load: %v (%T), want nil or a *schemas.Error", err, err)
	}
	if !listed() {
		t.Fatalf("a second load unlisted it: %+v", e.Stats())
	}

	if err := ad.UnloadAdapter(ctx, name); err != nil {
		t.Fatal(err)
	}
	if listed() {
		t.Fatalf("unloaded, but still in Stats: %+v", e.Stats())
	}
	testenv.WaitFor(t, waitLong, func() error {
		if ms := e.Models(); slices.Contains(ms, name) {
			return fmt.Errorf("unloaded, but still in Models: %q", ms)
		}
		return nil
	})
	_, err := generate(ctx, e, request(t, schemas.KindChat, name, `"stream":true`), newSink())
	asError(t, err, 404)
	if err := ad.UnloadAdapter(ctx, name); err != nil {
		asError(t, err, 404)
	}
}
