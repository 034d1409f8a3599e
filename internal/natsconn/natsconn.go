package natsconn

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// Options are the NATS connection flags.
type Options struct {
	URL      string
	Creds    string
	User     string
	Password string
	Token    string
	NKey     string
	TLSCA    string
	TLSCert  string
	TLSKey   string
	Inbox    string
}

// Register defines the flags on fs.
func (o *Options) Register(fs *pflag.FlagSet) {
	fs.StringVar(&o.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	fs.StringVar(&o.Creds, "nats-creds", "", "NATS credentials file (JWT + nkey seed)")
	fs.StringVar(&o.User, "nats-user", "", "NATS user name")
	fs.StringVar(&o.Password, "nats-password", "", "NATS password")
	fs.StringVar(&o.Token, "nats-token", "", "NATS authentication token")
	fs.StringVar(&o.NKey, "nats-nkey", "", "NATS nkey seed file")
	fs.StringVar(&o.TLSCA, "nats-tls-ca", "", "CA certificate file to verify the NATS server")
	fs.StringVar(&o.TLSCert, "nats-tls-cert", "", "client certificate file for NATS mutual TLS")
	fs.StringVar(&o.TLSKey, "nats-tls-key", "", "client key file for NATS mutual TLS")
	fs.StringVar(&o.Inbox, "nats-inbox-prefix", "", "reply subject prefix (default _INBOX; workers _INBOX.workers); a tenant restricted by NATS permissions sets its own")
}

// NatsOptions turns the flags into nats.go options.
func (o *Options) NatsOptions(name string, log *slog.Logger) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		// nats.go gives a connection up for good after the same
		// authorization error twice in a row (a password rotated on the
		// server before the process's secret): the process would have to
		// exit. It keeps trying instead; /ready says it is not connected.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(64 << 20),
		// A server that dies without closing the connection (power, a
		// partition) is noticed after 2 unanswered pings: ~4-6s, then the
		// client moves to another URL of the list (a killed server's closed
		// socket is noticed at once).
		nats.PingInterval(2 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			log.Error("nats async error", "subject", subj, "err", err)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
	}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.NKey != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKey)
		if err != nil {
			return nil, fmt.Errorf("nats nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	if o.Inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.Inbox))
	}
	return opts, nil
}

// Connect dials the server, retrying for up to wait (a server that starts a
// little after us, as under docker compose, is normal).
func (o *Options) Connect(ctx context.Context, name string, wait time.Duration, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := o.NatsOptions(name, log)
	if err != nil {
		return nil, err
	}
	opts = append(opts, extra...)
	deadline := time.Now().Add(wait)
	for {
		nc, err := nats.Connect(o.URL, opts...)
		if err == nil {
			return nc, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connect to NATS at %s: %w", redactURLs(o.URL), err)
		}
		log.Warn("NATS not reachable yet; retrying", "url", redactURLs(o.URL), "err", err)
		select {
		case <-ctx.Done(): // SIGTERM while NATS is away
			return nil, fmt.Errorf("connect to NATS at %s: %w (last error: %v)", redactURLs(o.URL), ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Drain drains nc (subscriptions finish what they hold, publishes are
// flushed) and waits, at most timeout, for it to close. A connection that
// cannot drain (reconnecting, closed) is closed.
func Drain(nc *nats.Conn, timeout time.Duration) {
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	deadline := time.Now().Add(timeout)
	for !nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	nc.Close()
}

// redactURLs is a comma-separated URL list with any user information
// replaced, for logs and errors: nats://user:pass@host and nats://token@host
// are valid --nats-url forms.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil:
			if strings.Contains(p, "@") {
				parts[i] = "(unparsable URL)"
			}
		case u.User != nil:
			u.User = url.User("REDACTED")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
