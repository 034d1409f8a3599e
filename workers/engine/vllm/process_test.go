package vllm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// childConfig runs this test binary as a stand-in "vllm serve" on a free port.
func childConfig(t *testing.T, env ...string) Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	var c Config
	c.Command = fmt.Sprintf("exec '%s' serve base --port %d --enable-lora --max-loras 3", exe, port)
	c.Env = append([]string{"FAKEVLLM_CHILD=1"}, env...)
	c.HealthInterval = 10 * time.Millisecond
	c.ModelsInterval = 50 * time.Millisecond
	c.MetricsInterval = 20 * time.Millisecond
	c.RestartBackoff = 50 * time.Millisecond
	c.StopGrace = 300 * time.Millisecond
	c.Logger = slog.New(slog.DiscardHandler)
	return c
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// logRecorder keeps log messages.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.mu.Lock()
	r.msgs = append(r.msgs, b.String())
	r.mu.Unlock()
	return nil
}

func (r *logRecorder) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// Spawn, wait for /health, restart with backoff after a crash, stop on Close.
func TestChildProcess(t *testing.T) {
	cfg := childConfig(t)
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := e.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := get(t, e.URL()+"/env?name=VLLM_ALLOW_RUNTIME_LORA_UPDATING"); got != "True" {
		t.Errorf("child has VLLM_ALLOW_RUNTIME_LORA_UPDATING=%q", got)
	}
	pid, _ := strconv.Atoi(get(t, e.URL()+"/pid"))
	if pid == 0 || pid != e.PID() {
		t.Errorf("child pid %d, engine says %d", pid, e.PID())
	}
	if st := e.Stats(); st.MaxLoras != 3 {
		t.Errorf("max_loras %d, want the command's 3", st.MaxLoras)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if !logs.has("INFO fake vllm serving on port") || !logs.has("stream=stderr") {
			return errors.New("the child's output was not logged")
		}
		return nil
	})
	if _, err := e.Generate(t.Context(), request("base", ""), &recSink{}); err != nil {
		t.Fatal(err)
	}

	// It dies: Health fails, it comes back (a new process) and serves again.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if e.Health(t.Context()) == nil {
			return errors.New("healthy after the child died")
		}
		return nil
	})
	healthy(t, e, 20*time.Second)
	pid2, _ := strconv.Atoi(get(t, e.URL()+"/pid"))
	if pid2 == pid || e.Restarts() != 1 {
		t.Errorf("pid %d → %d, %d restarts", pid, pid2, e.Restarts())
	}
	if !logs.has("engine process ended how=signal: killed") {
		t.Errorf("the death was not logged: %q", logs.msgs)
	}
	if _, err := e.Generate(t.Context(), request("base", ""), &recSink{}); err != nil {
		t.Fatal(err)
	}

	e.Close()
	if alive(pid2) {
		t.Errorf("child %d still alive after Close", pid2)
	}
	if e.PID() != 0 {
		t.Errorf("PID %d after Close", e.PID())
	}
}

// A child that ignores SIGTERM is killed after StopGrace.
func TestChildStopGrace(t *testing.T) {
	cfg := childConfig(t, "FAKEVLLM_IGNORE_TERM=1")
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := e.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	pid := e.PID()
	start := time.Now()
	e.Close()
	if d := time.Since(start); d < cfg.StopGrace || d > 5*time.Second {
		t.Errorf("Close took %s with a grace of %s", d, cfg.StopGrace)
	}
	if alive(pid) {
		t.Errorf("child %d still alive", pid)
	}
}

// A child never healthy within StartTimeout is killed and started again,
// with a growing backoff; WaitReady says why it is not ready.
func TestChildStartTimeout(t *testing.T) {
	cfg := childConfig(t, "FAKEVLLM_UNHEALTHY=1")
	cfg.StartTimeout = 200 * time.Millisecond
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	testenv.WaitFor(t, 20*time.Second, func() error {
		if n := e.Restarts(); n < 2 {
			return fmt.Errorf("%d restarts", n)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err = e.WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "was not healthy within 200ms") {
		t.Errorf("WaitReady: %v", err)
	}
}
