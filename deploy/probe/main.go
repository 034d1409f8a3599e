package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/schemas"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "tokenbus-probe:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  tokenbus-probe http URL [--timeout 3s]
  tokenbus-probe heartbeat [--id ID] [--timeout 5s] [--require-healthy] [NATS flags: --nats-url ...]`

func run(ctx context.Context, args []string, stdout io.Writer, getenv func(string) string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "http":
		return probeHTTP(ctx, args[1:], stdout)
	case "heartbeat":
		return probeHeartbeat(ctx, args[1:], stdout, getenv)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown probe %q\n%s", args[0], usage)
}

func probeHTTP(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flagenv.NewFlagSet("http")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New(usage)
	}
	url := fs.Arg(0)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "%s: %s\n", url, resp.Status)
	return nil
}

func probeHeartbeat(ctx context.Context, args []string, stdout io.Writer, getenv func(string) string) error {
	fs := flagenv.NewFlagSet("heartbeat")
	var nopts natsconn.Options
	nopts.Register(fs)
	id := fs.String("id", "", "worker id whose heartbeat to wait for (default: any id starting with this host name)")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long (workers beat every second)")
	requireHealthy := fs.Bool("require-healthy", false, "also require the engine to report healthy")
	fs.SetOutput(io.Discard)
	// Same precedence as the worker itself: flag > TOKENBUS_* > default, so
	// the probe connects exactly as the worker in its container does.
	if err := flagenv.Parse(fs, args, getenv); err != nil {
		return err
	}
	match := func(w string) bool { return w == *id }
	subject := schemas.HeartbeatSubject(*id)
	if *id == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return errors.New("no --id and no host name to match worker ids against")
		}
		prefix := schemas.SafeToken(host) + "-" // the worker's default id prefix
		match = func(w string) bool { return strings.HasPrefix(w, prefix) }
		subject = schemas.HeartbeatPrefix + "*"
	}
	opts, err := nopts.NatsOptions("tokenbus-probe", slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	opts = append(opts, nats.Timeout(*timeout), nats.MaxReconnects(0), nats.NoReconnect())
	nc, err := nats.Connect(nopts.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", nopts.URL, err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		return err
	}
	// A permissions violation comes back asynchronously; Flush makes it show.
	if err := nc.FlushTimeout(*timeout); err != nil {
		return err
	}
	if err := nc.LastError(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var last string
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if last != "" {
				return fmt.Errorf("no heartbeat from a matching worker within %s (last refused: %s)", *timeout, last)
			}
			return fmt.Errorf("no heartbeat on %s within %s", subject, *timeout)
		}
		var hb schemas.Heartbeat
		if err := json.Unmarshal(m.Data, &hb); err != nil || !match(hb.Worker) {
			continue
		}
		if *requireHealthy && !hb.Healthy {
			last = fmt.Sprintf("worker %s reports its engine unhealthy", hb.Worker)
			continue
		}
		fmt.Fprintf(stdout, "worker %s: running %d/%d, healthy %v, draining %v\n",
			hb.Worker, hb.Running, hb.MaxConcurrency, hb.Healthy, hb.Draining)
		return nil
	}
}
