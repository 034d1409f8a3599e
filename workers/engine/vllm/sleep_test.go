package vllm

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"

	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// Sleep mode over HTTP against the sim-server's copies of vLLM's routes:
// Sleep, WakeUp and Sleeping as /is_sleeping says; asleep, a generation is
// refused (the worker never sends one).
func TestSleepOverHTTP(t *testing.T) {
	sc := enginetest.SimConfig("base")
	sc.SleepTime, sc.WakeTime = 0, 50*time.Millisecond
	url := enginetest.SimServer(t, sc, simserver.Config{DevMode: true, SleepMode: true})
	cfg := fastConfig(url)
	cfg.SleepMode = true
	e := newEngine(t, cfg)
	ctx := t.Context()
	if asleep, err := e.RefreshSleeping(ctx); err != nil || asleep || e.Sleeping() {
		t.Fatalf("at start: is_sleeping %v, %v; Sleeping %v", asleep, err, e.Sleeping())
	}
	if err := e.Sleep(ctx); err != nil {
		t.Fatal(err)
	}
	if asleep, err := e.RefreshSleeping(ctx); err != nil || !asleep || !e.Sleeping() {
		t.Fatalf("after Sleep: is_sleeping %v, %v; Sleeping %v", asleep, err, e.Sleeping())
	}
	if _, err := e.Generate(ctx, request("base", ""), &recSink{}); err == nil {
		t.Fatal("a generation on a sleeping server succeeded")
	} else if se := asError(t, err, 503); !strings.Contains(se.Body.Message, "asleep") {
		t.Fatalf("a generation while asleep: %+v", se)
	}
	start := time.Now()
	if err := e.WakeUp(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < sc.WakeTime {
		t.Fatalf("woke in %v, under the sim's %v", took, sc.WakeTime)
	}
	if e.Sleeping() {
		t.Fatal("Sleeping after WakeUp")
	}
	if _, err := e.Generate(ctx, request("base", ""), &recSink{}); err != nil {
		t.Fatalf("after the wake-up: %v", err)
	}
	// A Sleep cut short by its caller: the engine reads the server's state
	// again, so Sleeping tells what happened there.
	slow := enginetest.SimConfig("base")
	slow.SleepTime = time.Second // the server's shutdown waits for it
	url2 := enginetest.SimServer(t, slow, simserver.Config{DevMode: true, SleepMode: true})
	cfg2 := fastConfig(url2)
	cfg2.SleepMode = true
	e2 := newEngine(t, cfg2)
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := e2.Sleep(sctx); err == nil {
		t.Fatal("a sleep of a second returned in 50ms")
	}
	if !e2.Sleeping() {
		t.Fatal("not Sleeping after a sleep cut short here that goes on there")
	}
}

// Without VLLM_SERVER_DEV_MODE=1 vLLM has no sleep routes: the errors say
// what to do. Without --enable-sleep-mode its sleep fails with its 500.
func TestSleepRoutesMissing(t *testing.T) {
	url := enginetest.SimServer(t, enginetest.SimConfig("base"), simserver.Config{SleepMode: true})
	cfg := fastConfig(url)
	cfg.SleepMode = true
	e := newEngine(t, cfg)
	_, err := e.RefreshSleeping(t.Context())
	if se := asError(t, err, 404); !strings.Contains(se.Body.Message, EnvDevMode) || !strings.Contains(se.Body.Message, flagSleepMode) {
		t.Fatalf("GET /is_sleeping without dev mode: %+v", se)
	}
	if se := asError(t, e.Sleep(t.Context()), 404); !strings.Contains(se.Body.Message, EnvDevMode) {
		t.Fatalf("Sleep without dev mode: %+v", se)
	}
	if e.Sleeping() {
		t.Fatal("Sleeping after a failed Sleep")
	}

	url = enginetest.SimServer(t, enginetest.SimConfig("base"), simserver.Config{DevMode: true})
	e = newEngine(t, fastConfig(url))
	if se := asError(t, e.Sleep(t.Context()), 500); !strings.Contains(se.Body.Message, "Sleep mode is not enabled") {
		t.Fatalf("Sleep without sleep mode: %+v", se)
	}
}

// A child started for a worker that sleeps: its command must enable sleep
// mode, and it gets VLLM_SERVER_DEV_MODE=1.
func TestSleepModeChild(t *testing.T) {
	cfg := childConfig(t)
	cfg.SleepMode = true
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), flagSleepMode) {
		t.Fatalf("a command without %s: %v", flagSleepMode, err)
	}
	cfg.Command += " " + flagSleepMode
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	healthy(t, e, 20*time.Second)
	if got := get(t, e.URL()+"/env?name=VLLM_SERVER_DEV_MODE"); got != "1" {
		t.Errorf("child has VLLM_SERVER_DEV_MODE=%q", got)
	}
	// A child that dies asleep comes back awake, and Sleeping says so.
	e.setSleeping(true)
	if !e.Sleeping() {
		t.Fatal("not Sleeping")
	}
	if err := syscall.Kill(e.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, func() error {
		if e.Restarts() != 1 || e.Sleeping() {
			return fmt.Errorf("%d restarts, sleeping %v", e.Restarts(), e.Sleeping())
		}
		return nil
	})
	for cmd, want := range map[string]bool{"vllm serve m --enable-sleep-mode": true, "vllm serve m --enable-sleep-mode=true": true,
		"vllm serve m '--enable-sleep-mode'": true, "vllm serve m --enable-sleep-mode-x": false, "vllm serve m": false} {
		if hasFlag(cmd, flagSleepMode) != want {
			t.Errorf("hasFlag(%q) = %v", cmd, !want)
		}
	}
}
