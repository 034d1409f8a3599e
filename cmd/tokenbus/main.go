package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/tokenbus/tokenbus/internal/cli"
)

func main() {
	// Streaming makes short-lived garbage at every token; the default GOGC
	// (100) spent a quarter of the gateway's CPU in the collector. 400
	// trades heap headroom for CPU. GOGC and GOMEMLIMIT in the environment
	// still win.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tokenbus:", err)
		os.Exit(1)
	}
}
