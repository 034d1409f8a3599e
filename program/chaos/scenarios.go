package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// scenario is one fault under load.
type scenario struct {
	name, fault string
	shape       shape
	// closedLoop: clients, started one after the other, send requests back
	// to back for Config.Duration, so the fault finds requests at every
	// stage (routing, streaming, writing usage); otherwise each client
	// sends one stream, all at once.
	closedLoop bool
	// inject does the fault and returns the gateway the probe request goes
	// to and what to do once the probe has been sent (a restart).
	inject func(ctx context.Context, t *topology, cfg Config) (probeGW int, after func() error, err error)
}

var scenarios = []scenario{
	{
		name: "worker", fault: "kill -9 one of 3 workers",
		shape: shape{natsNodes: 1, gateways: 1, embed: true, workers: 3},
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			t.workers[0].kill9()
			return 0, nil, nil
		},
	},
	{
		name: "gateway", fault: "kill -9 one of 2 gateways (clients round-robin)",
		shape: shape{natsNodes: 1, gateways: 2, embed: true, workers: 3},
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			t.gateways[0].kill9()
			return 1, nil, nil
		},
	},
	{
		name: "dispatcher", fault: "kill -9 one of 2 standalone dispatchers (gateway --embed-dispatcher=false)",
		shape: shape{natsNodes: 1, gateways: 1, embed: false, dispatchers: 2, workers: 3},
		// Streams already routed do not touch a dispatcher again: the
		// fault must find requests being routed.
		closedLoop: true,
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			t.dispatchers[0].kill9()
			return 0, nil, nil
		},
	},
	{
		name: "nats-node", fault: "kill -9 the busiest node of a 3-node NATS cluster",
		shape: shape{natsNodes: 3, gateways: 1, embed: true, workers: 3},
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			busiest, most, total := 0, -1, 0
			var names []string
			for i, n := range t.nats {
				c := n.clients()
				total += len(c)
				if len(c) > most {
					busiest, most, names = i, len(c), c
				}
			}
			t.nats[busiest].kill9()
			t.note(fmt.Sprintf("killed %s, which had %d of the %d client connections: %s",
				t.nats[busiest].name, most, total, strings.Join(names, ", ")))
			return 0, nil, nil
		},
	},
	{
		name: "nats-restart", fault: "kill -9 the single NATS server and start it again on its port",
		shape: shape{natsNodes: 1, gateways: 1, embed: true, workers: 3},
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			t.nats[0].kill9()
			if err := t.nats[0].start(); err != nil {
				return 0, nil, err
			}
			return 0, nil, waitFor(ctx, 30*time.Second, "nats back", httpOK(t.nats[0].healthz()))
		},
	},
	{
		name: "redis", fault: "kill -9 redis-server (AOF, auth on); restart it on its port after the outage (-outage)",
		shape:      shape{natsNodes: 1, gateways: 1, embed: true, workers: 3, auth: true},
		closedLoop: true,
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			t.redis.kill9()
			return 0, func() error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(cfg.Outage):
				}
				if err := t.redis.start(); err != nil {
					return err
				}
				return waitFor(ctx, 15*time.Second, "redis back", tcpUp(t.redisPort))
			}, nil
		},
	},
}

// Names lists the scenarios, in the order a full run takes them.
func Names() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.name
	}
	return out
}

func lookup(name string) (scenario, error) {
	i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == name })
	if i < 0 {
		return scenario{}, fmt.Errorf("no scenario %q (have %v)", name, Names())
	}
	return scenarios[i], nil
}
