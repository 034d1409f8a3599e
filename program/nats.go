package program

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/natsconn"
)

// connectWait is how long a program retries a NATS server that is not up yet
// (a server that starts a little after us, as under docker compose, is normal).
const connectWait = 30 * time.Second

// drainWait bounds how long a program's NATS connection may take to drain at
// the end.
const drainWait = 5 * time.Second

// dialer connects one part of a program to NATS, with o's settings and name
// as the connection's name.
type dialer func(ctx context.Context, o natsconn.Options, name string, log *slog.Logger) (*nats.Conn, error)

// dialURL dials o.URL, retrying for up to connectWait.
func dialURL(ctx context.Context, o natsconn.Options, name string, log *slog.Logger) (*nats.Conn, error) {
	return o.Connect(ctx, name, connectWait, log)
}

// dialInProcess connects to ns, a server in this process (dev's), with o's
// settings (the async-error logging every program has) and no network.
func dialInProcess(ns *server.Server) dialer {
	return func(_ context.Context, o natsconn.Options, name string, log *slog.Logger) (*nats.Conn, error) {
		opts, err := o.NatsOptions(name, log)
		if err != nil {
			return nil, err
		}
		// No write deadline on the in-process pipe: the reader is the server's
		// read loop in this process, which never stops reading while the
		// server runs (and closing the server closes the pipe), whereas a
		// deadline costs a timer set and stopped per flush.
		return nats.Connect("", append(opts, nats.InProcessServer(ns), nats.FlusherTimeout(0))...)
	}
}

// drain drains nc, if any, within drainWait, and closes it.
func drain(nc *nats.Conn) {
	if nc != nil {
		natsconn.Drain(nc, drainWait)
	}
}
