// Command tokenbus is the one binary of tokenbus; the subcommand chooses the
// role. All the work is in internal/cli so that tests run whole programs.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokenbus/tokenbus/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tokenbus:", err)
		os.Exit(1)
	}
}
