package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tokenbus/tokenbus/program/chaos"
)

func main() {
	var (
		cfg       chaos.Config
		scenarios string
		jsonPath  string
	)
	fs := flag.NewFlagSet("chaos", flag.ExitOnError)
	fs.StringVar(&scenarios, "scenarios", "", "comma-separated scenarios to run (default: all of "+strings.Join(chaos.Names(), ",")+")")
	fs.IntVar(&cfg.Streams, "streams", 150, "concurrent client streams")
	fs.IntVar(&cfg.Tokens, "tokens", 300, "tokens per stream (ignore_eos)")
	fs.DurationVar(&cfg.Pace, "pace", 20*time.Millisecond, "the sim's decode step, about the time per token")
	fs.DurationVar(&cfg.Duration, "duration", 15*time.Second, "closed-loop scenarios (dispatcher, redis): how long clients send requests")
	fs.DurationVar(&cfg.Outage, "outage", 5*time.Second, "redis: how long it stays down before it is restarted")
	fs.IntVar(&cfg.Repeat, "repeat", 1, "runs of each scenario")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for binaries, logs and data (default: a temporary one, removed after a clean run)")
	fs.StringVar(&jsonPath, "json", "", "also write the results as JSON to this file")
	_ = fs.Parse(os.Args[1:])
	if scenarios != "" {
		cfg.Scenarios = strings.Split(scenarios, ",")
	}
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, cfg)
	if rep != nil {
		rep.Markdown(os.Stdout)
		if jsonPath != "" {
			if werr := rep.WriteJSON(jsonPath); werr != nil {
				fmt.Fprintln(os.Stderr, "chaos:", werr)
				os.Exit(1)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}
