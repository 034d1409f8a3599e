package sysmon

import (
	"os"
	"syscall"
)

// Exec re-executes the running program (same arguments, same process id)
// with Setting in GODEBUG, unless GODEBUG already names schedtrace. It
// returns only when it did not: nothing to do, or the program could not be
// found or executed (the process then runs on with the runtime's default).
func Exec() error {
	environ, ok := env(os.Environ())
	if !ok {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(exe, os.Args, environ)
}
