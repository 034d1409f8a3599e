package vllm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// switchConfig is childConfig's template with a command per model: this
// test binary as "vllm serve <model>" on a port of its own.
func switchConfig(t *testing.T, models ...string) (Config, []ModelCommand) {
	t.Helper()
	var cmds []ModelCommand
	for _, m := range models {
		c := childConfig(t)
		cmds = append(cmds, ModelCommand{Name: m, Command: strings.Replace(c.Command, " serve base ", " serve "+m+" ", 1)})
	}
	cfg := childConfig(t)
	cfg.Command = ""
	return cfg, cmds
}

func TestParseModelCommand(t *testing.T) {
	if m, err := ParseModelCommand(" llama = vllm serve x --port 8001 --max-loras=2 "); err != nil || m.Name != "llama" || m.Command != "vllm serve x --port 8001 --max-loras=2" {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range []string{"llama", "=vllm serve", "llama="} {
		if _, err := ParseModelCommand(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// Switch stops one model's vLLM and starts the other's; the first model's
// process is gone, the second serves, and back again.
func TestSwitchingStopsOneStartsTheOther(t *testing.T) {
	cfg, cmds := switchConfig(t, "a", "b")
	s, err := NewSwitching(cfg, cmds)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	changed := make(chan struct{}, 16)
	s.NotifyModels(func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.CanServe(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("can serve %q", got)
	}
	if got := s.Models(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("models %q", got)
	}
	if _, err := s.Generate(t.Context(), request("a", ""), &recSink{}); err != nil {
		t.Fatal(err)
	}
	pidA := s.PID()
	if err := s.Switch(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if alive(pidA) {
		t.Errorf("a's vLLM (pid %d) still runs after the switch", pidA)
	}
	if got := s.Models(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("models after the switch %q", got)
	}
	if s.PID() == pidA || s.Health(t.Context()) != nil {
		t.Fatalf("pid %d (was %d), health %v", s.PID(), pidA, s.Health(t.Context()))
	}
	if _, err := s.Generate(t.Context(), request("b", ""), &recSink{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Generate(t.Context(), request("a", ""), &recSink{}); err == nil {
		t.Fatal("b's vLLM served a")
	}
	select {
	case <-changed:
	default:
		t.Fatal("no models notice for the switch")
	}
	if err := s.Switch(ctx, "b"); err != nil {
		t.Fatalf("a switch to the model served: %v", err)
	}
	if err := s.Switch(ctx, "x"); err == nil {
		t.Fatal("a switch to a model it has no command for")
	}
	if err := s.Switch(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := s.Models(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("models after switching back %q", got)
	}
	pid := s.PID()
	s.Close()
	if alive(pid) {
		t.Errorf("child %d alive after Close", pid)
	}
}

// A model whose vLLM never comes up: the switch fails and the old model is
// served again.
func TestSwitchingFailsBack(t *testing.T) {
	cfg, cmds := switchConfig(t, "a", "b")
	cfg.StartTimeout = 2 * time.Second
	cmds[1].Command = "FAKEVLLM_UNHEALTHY=1 " + cmds[1].Command
	s, err := NewSwitching(cfg, cmds)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	err = s.Switch(ctx, "b")
	if err == nil || !strings.Contains(err.Error(), "serving a again") {
		t.Fatalf("switch to a vLLM that never comes up: %v", err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if got := s.Models(); !slices.Equal(got, []string{"a"}) {
			return fmt.Errorf("models %q, want a again", got)
		}
		return nil
	})
	if _, err := s.Generate(t.Context(), request("a", ""), &recSink{}); err != nil {
		t.Fatal(err)
	}
}

// A switch called off while the new vLLM comes up (the worker stops)
// returns at once: the old model is not started again.
func TestSwitchingCalledOff(t *testing.T) {
	cfg, cmds := switchConfig(t, "a", "b")
	cfg.StartTimeout = time.Minute
	cmds[1].Command = "FAKEVLLM_UNHEALTHY=1 " + cmds[1].Command
	s, err := NewSwitching(cfg, cmds)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ready, cancelReady := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancelReady()
	if err := s.WaitReady(ready); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	start := time.Now()
	err = s.Switch(ctx, "b")
	if err == nil || !strings.Contains(err.Error(), "called off") {
		t.Fatalf("a switch called off: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the switch took %v after it was called off", took)
	}
	if got := s.Models(); len(got) != 0 {
		t.Fatalf("models %q after a switch called off", got)
	}
}

// A command that serves the model under another name is refused at once.
func TestSwitchingChecksTheServedName(t *testing.T) {
	cfg, cmds := switchConfig(t, "a", "b")
	cmds[0].Name = "llama"
	s, err := NewSwitching(cfg, cmds)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err == nil || !strings.Contains(err.Error(), "--served-model-name llama") {
		t.Fatalf("WaitReady: %v", err)
	}
}
