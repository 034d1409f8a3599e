package httpengine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// process supervises the server as a child: Command run by /bin/sh -c (with
// exec in front if it is a simple command) in its own process group, with Env added to the worker's environment and each
// line of its output logged (message = the line, attrs engine, pid, stream).
//
// A child that exits is restarted after RestartBackoff, doubled after each
// start that never became healthy, up to MaxRestartBackoff (back to
// RestartBackoff once a start has served). A child not healthy StartTimeout
// after its start is killed and restarted the same way. Stopping sends
// SIGTERM to the group, SIGKILL after StopGrace; after the leader exits the
// group gets a SIGKILL anyway, so that no orphan keeps a GPU.
type process struct {
	e   *Engine
	log *slog.Logger

	mu       sync.Mutex
	pid      int    // 0: not running
	why      string // when not running: why, for Health
	healthy  bool   // the current child has answered a health probe
	last     string // how the last child ended
	restarts int
}

func newProcess(e *Engine) *process {
	return &process{e: e, log: e.log, why: "child process starting"}
}

// down says why no child is running, "" when one is.
func (p *process) down() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pid != 0 {
		return ""
	}
	return p.why
}

func (p *process) markHealthy() {
	p.mu.Lock()
	p.healthy = true
	p.mu.Unlock()
}

func (p *process) lastExit() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// PID is the child's process id (the shell's, or the server's if the shell
// exec'd it); 0 when none runs or the engine was attached by URL.
func (e *Engine) PID() int {
	if e.proc == nil {
		return 0
	}
	e.proc.mu.Lock()
	defer e.proc.mu.Unlock()
	return e.proc.pid
}

// Restarts is how many times the child was started again.
func (e *Engine) Restarts() int {
	if e.proc == nil {
		return 0
	}
	e.proc.mu.Lock()
	defer e.proc.mu.Unlock()
	return e.proc.restarts
}

func (p *process) run(stop <-chan struct{}) {
	cfg := &p.e.cfg
	backoff := cfg.RestartBackoff
	for {
		how, healthy, stopped := p.once(stop)
		if stopped {
			return
		}
		if healthy {
			backoff = cfg.RestartBackoff
		}
		p.mu.Lock()
		p.pid, p.last = 0, how
		p.why = fmt.Sprintf("child process %s; restarting in %s", how, backoff)
		p.mu.Unlock()
		p.log.Error("engine process ended", "how", how, "restart_in", backoff)
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, cfg.MaxRestartBackoff)
		p.mu.Lock()
		p.restarts++
		p.mu.Unlock()
	}
}

// once runs one child until it ends (how, and whether it was ever healthy)
// or stop closes (stopped).
func (p *process) once(stop <-chan struct{}) (how string, healthy, stopped bool) {
	cfg := &p.e.cfg
	cmd := exec.Command("/bin/sh", "-c", shellLine(cfg.Command))
	cmd.Env = append(os.Environ(), cfg.Env...)
	setProcAttr(cmd)
	cmd.WaitDelay = 5 * time.Second // a grandchild holding our pipes open must not block Wait
	out, errOut := &lineLog{stream: "stdout"}, &lineLog{stream: "stderr"}
	out.log.Store(p.log)
	errOut.log.Store(p.log)
	cmd.Stdout, cmd.Stderr = out, errOut
	if err := cmd.Start(); err != nil {
		return "could not start: " + err.Error(), false, false
	}
	log := p.log.With("pid", cmd.Process.Pid)
	out.log.Store(log) // the copying goroutines have started: lines before this go to p.log
	errOut.log.Store(log)
	p.mu.Lock()
	p.pid, p.why, p.healthy = cmd.Process.Pid, "", false
	p.mu.Unlock()
	log.Info("engine process started", "command", cfg.Command)

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	wasHealthy := func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.healthy }
	start := time.NewTimer(cfg.StartTimeout)
	defer start.Stop()
	for {
		select {
		case <-stop:
			p.terminate(cmd, exited, log)
			p.mu.Lock()
			p.pid, p.why = 0, "engine closed"
			p.mu.Unlock()
			return "", false, true
		case err := <-exited:
			signalGroup(cmd, syscall.SIGKILL) // whatever it left behind
			return describeExit(err), wasHealthy(), false
		case <-start.C:
			if !wasHealthy() {
				log.Error("engine process not healthy in time: killing it", "start_timeout", cfg.StartTimeout)
				p.terminate(cmd, exited, log)
				return fmt.Sprintf("was not healthy within %s", cfg.StartTimeout), false, false
			}
		}
	}
}

// shellLine prefixes a simple command with exec, so the server replaces the
// shell: its pid is the child's, and the parent-death signal reaches it.
// Lists, pipes, subshells and leading assignments run as written.
func shellLine(cmd string) string {
	cmd = strings.TrimSpace(cmd)
	first, _, _ := strings.Cut(cmd, " ")
	if strings.ContainsAny(cmd, ";&|()\n") || strings.Contains(first, "=") || first == "exec" {
		return cmd
	}
	return "exec " + cmd
}

// terminate stops the child's group: SIGTERM, SIGKILL after StopGrace.
func (p *process) terminate(cmd *exec.Cmd, exited <-chan error, log *slog.Logger) {
	signalGroup(cmd, syscall.SIGTERM)
	t := time.NewTimer(p.e.cfg.StopGrace)
	defer t.Stop()
	select {
	case err := <-exited:
		log.Info("engine process stopped", "how", describeExit(err))
	case <-t.C:
		log.Warn("engine process ignored SIGTERM: killing it", "grace", p.e.cfg.StopGrace)
		signalGroup(cmd, syscall.SIGKILL)
		<-exited
	}
	signalGroup(cmd, syscall.SIGKILL)
}

func describeExit(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exited with status 0"
	case errors.As(err, &ee):
		return ee.ProcessState.String() // "exit status 1", "signal: killed"
	}
	return err.Error()
}

// lineLog logs each line written to it.
type lineLog struct {
	log    atomic.Pointer[slog.Logger]
	stream string
	buf    []byte
}

func (l *lineLog) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.buf = append(l.buf, p...)
			if len(l.buf) > 64<<10 {
				l.emit()
			}
			break
		}
		l.buf = append(l.buf, p[:i]...)
		l.emit()
		p = p[i+1:]
	}
	return n, nil
}

func (l *lineLog) emit() {
	line := strings.TrimRight(string(l.buf), "\r")
	l.buf = l.buf[:0]
	if line != "" {
		l.log.Load().Info(line, "stream", l.stream)
	}
}
