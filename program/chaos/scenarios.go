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
	// ready, if set, says when the fault is due instead of the tokens
	// received (a third of them): for a load that has no token yet.
	ready func(t *topology, cfg Config) error
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
		name: "cold-dispatcher", fault: "no worker: every stream held for capacity in 2 standalone dispatchers; kill -9 one, then start 3 workers",
		shape: shape{natsNodes: 1, gateways: 1, embed: false, dispatchers: 2},
		// The fault once every stream is held (no worker: no token).
		ready: func(t *topology, cfg Config) error {
			held, _ := gauges(t.dispMetrics, `tokenbus_dispatcher_capacity_waiting{model="`+model+`"}`)
			if held < float64(cfg.Streams) {
				return fmt.Errorf("%v of %d streams held", held, cfg.Streams)
			}
			return nil
		},
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			held, _ := gauges(t.dispMetrics[:1], `tokenbus_dispatcher_capacity_waiting{model="`+model+`"}`)
			t.dispatchers[0].kill9()
			t.note(fmt.Sprintf("killed dispatcher0, which held %v of the %d streams", held, cfg.Streams))
			return 0, func() error {
				// Its streams' clients hear no beat and send them again:
				// the other dispatcher holds them all (and the probe).
				killed := time.Now()
				if err := waitFor(ctx, 30*time.Second, "dispatcher1 holds every stream", func() error {
					n, _ := gauges(t.dispMetrics[1:], `tokenbus_dispatcher_capacity_waiting{model="`+model+`"}`)
					if n < float64(cfg.Streams) {
						return fmt.Errorf("%v held", n)
					}
					return nil
				}); err != nil {
					return err
				}
				t.note(fmt.Sprintf("dispatcher1 held every stream %.1f s after the kill; 3 workers started then", time.Since(killed).Seconds()))
				for range 3 {
					if err := t.startWorker(); err != nil {
						return err
					}
				}
				return nil
			}, nil
		},
	},
	{
		name: "prefill-worker", fault: "disaggregated: kill -9 one of 2 prefill workers while prefills run (3 decode workers)",
		shape: shape{natsNodes: 1, gateways: 1, embed: true, workers: 3, prefill: 2},
		// Every stream's prefill is over before a third of the tokens: the
		// fault must find prefills under way.
		closedLoop: true,
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			p0 := t.workerMetrics[len(t.workers) : len(t.workers)+1]
			var running float64
			if err := waitFor(ctx, 5*time.Second, "chaos-p0 runs prefills", func() error {
				if running, _ = gauges(p0, `tokenbus_worker_running{worker="chaos-p0"}`); running == 0 {
					return fmt.Errorf("no prefill running")
				}
				return nil
			}); err != nil {
				return 0, nil, err // a kill with no prefill running would test nothing
			}
			t.prefills[0].kill9()
			t.note(fmt.Sprintf("killed chaos-p0 with %v prefills running", running))
			return 0, func() error {
				// Its prefills' decode workers hear nothing for 1 s and run
				// them whole.
				decode := t.workerMetrics[:len(t.workers)]
				if err := waitFor(ctx, 5*time.Second, "the lost prefills run whole", func() error {
					if lost, _ := sumCounters(decode, `tokenbus_worker_remote_prefills_total{outcome="lost"`); lost < running {
						return fmt.Errorf("%v lost prefills seen", lost)
					}
					return nil
				}); err != nil {
					return err
				}
				lost, _ := sumCounters(decode, `tokenbus_worker_remote_prefills_total{outcome="lost"`)
				t.note(fmt.Sprintf("decode workers ran %v requests whole after losing their prefill", lost))
				return nil
			}, nil
		},
	},
	{
		name: "decode-worker", fault: "disaggregated: kill -9 one of 3 decode workers mid-stream (2 prefill workers)",
		shape: shape{natsNodes: 1, gateways: 1, embed: true, workers: 3, prefill: 2},
		inject: func(ctx context.Context, t *topology, cfg Config) (int, func() error, error) {
			t.workers[0].kill9()
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
