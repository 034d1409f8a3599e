package httpengine

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the child in its own process group, so that signals reach
// the processes it starts (vLLM's engine core runs in another process), and
// has it sent SIGTERM if the worker dies first.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// signalGroup signals the child's whole process group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}
