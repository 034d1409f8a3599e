//go:build !linux

package httpengine

import (
	"os/exec"
	"syscall"
)

func setProcAttr(*exec.Cmd) {}

// signalGroup signals the child only: without process groups, SIGKILL is a
// plain Kill and anything else an interrupt.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		_ = cmd.Process.Kill()
		return
	}
	_ = cmd.Process.Signal(sig)
}
