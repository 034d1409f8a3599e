package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokenbus/tokenbus/internal/gctune"
	"github.com/tokenbus/tokenbus/internal/sysmon"
	"github.com/tokenbus/tokenbus/program/cli"
)

// servers are the commands that run until stopped: they re-execute with the
// runtime's monitor thread calmed (internal/sysmon), the others run as they are.
var servers = map[string]bool{"dev": true, "gateway": true, "dispatcher": true, "worker": true, "sim-server": true}

func main() {
	if len(os.Args) > 1 && servers[os.Args[1]] {
		if err := sysmon.Exec(); err != nil {
			fmt.Fprintln(os.Stderr, "tokenbus: running without GODEBUG="+sysmon.Setting+":", err)
		}
	}
	// Streaming makes short-lived garbage at every token: GOGC is set from
	// the live heap after each collection (up to 400 for a small heap, for
	// the collector's CPU; 100 from 64 MiB live up, for memory). GOGC and
	// GOMEMLIMIT in the environment still win.
	gctune.Start(gctune.Default)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tokenbus:", err)
		os.Exit(1)
	}
}
