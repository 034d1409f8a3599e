package embedded

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// NATS starts a NATS server listening on addr ("host:port"; port -1 picks a
// free one) with JetStream storing under dir.
func NATS(addr, dir string) (*server.Server, error) {
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("nats listen address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("nats listen port %q: %w", portS, err)
	}
	if port == 0 {
		port = -1 // 0 would mean the default 4222 to nats-server
	}
	ns, err := server.NewServer(&server.Options{
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true, // else SIGINT makes the server call os.Exit
		NoLog:      true,
		MaxPayload: 8 << 20, // big prompts
	})
	if err != nil {
		return nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start on %s", addr)
	}
	return ns, nil
}

// Redis starts an in-memory Redis-compatible server (miniredis) on a local
// port and returns it with its redis:// URL. It speaks real RESP, so the same
// go-redis code runs against it and against a real Redis.
func Redis() (*miniredis.Miniredis, string, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, "", err
	}
	return mr, "redis://" + mr.Addr(), nil
}
