package dispatcher

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// gauges reads every series of the per-model gauges from reg as
// "name{model}" -> value.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		name := strings.TrimPrefix(f.GetName(), "tokenbus_dispatcher_")
		if name != "queue_depth" && name != "workers" && name != "running" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[name+"{"+m.GetLabel()[0].GetValue()+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

func wantGauges(t *testing.T, reg *prometheus.Registry, want map[string]float64) func() error {
	return func() error {
		if got := gauges(t, reg); !maps.Equal(got, want) {
			keys := slices.Sorted(maps.Keys(got))
			return fmt.Errorf("gauges %v (%v), want %v", got, keys, want)
		}
		return nil
	}
}

// Every model the dispatcher knows has its queue depth, workers and running
// from start-up, 0 when idle; a queue that empties reads 0 again instead of
// vanishing (an autoscaler reading the series would read nothing). Adapters
// queue under their own name but run on their base's workers: they have a
// queue depth only.
func TestModelGaugesExistFromStartUp(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	reg := prometheus.NewRegistry()
	models := fakeRegistry{"m": {Name: "m"}, "idle": {Name: "idle"}, "m-lora": {Name: "m-lora", Base: "m", Path: "/l"}}
	d := New(Config{QueueTimeout: time.Minute}, nc, models, reg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	t.Cleanup(func() { cancel(); <-done })

	// Before any worker or request: a series per registered model, at 0.
	if err := wantGauges(t, reg, map[string]float64{
		"queue_depth{m}": 0, "queue_depth{idle}": 0, "queue_depth{m-lora}": 0,
		"workers{m}": 0, "workers{idle}": 0, "running{m}": 0, "running{idle}": 0,
	})(); err != nil {
		t.Fatal(err)
	}

	// A worker of m (and of a model nobody registered) with room for one.
	w := newFakeWorker(t, nc, "a", 1)
	testenv.WaitFor(t, 2*time.Second, func() error {
		if d.Fleet().Serving("m") != 1 {
			return fmt.Errorf("worker not seen")
		}
		return nil
	})
	sendRequest(t, nc, "m", "r1")
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 1))
	queued := sendRequest(t, nc, "m", "r2")
	testenv.WaitFor(t, 2*time.Second, func() error {
		if f, _ := queued.last(); f.Type != schemas.FrameQueued {
			return fmt.Errorf("r2 not queued")
		}
		return nil
	})
	testenv.WaitFor(t, 2*time.Second, wantGauges(t, reg, map[string]float64{
		"queue_depth{m}": 1, "queue_depth{idle}": 0, "queue_depth{m-lora}": 0,
		"workers{m}": 1, "workers{idle}": 0, "running{m}": 1, "running{idle}": 0,
	}))

	// The first finishes: the second leaves the queue, whose series stays at 0.
	w.done(t, 0)
	testenv.WaitFor(t, 2*time.Second, wantCount(w, 2))
	w.done(t, 0)
	testenv.WaitFor(t, 2*time.Second, wantGauges(t, reg, map[string]float64{
		"queue_depth{m}": 0, "queue_depth{idle}": 0, "queue_depth{m-lora}": 0,
		"workers{m}": 1, "workers{idle}": 0, "running{m}": 0, "running{idle}": 0,
	}))
}

// A dispatcher with no registry knows the models its workers serve; a
// worker's loaded adapters are not base models.
func TestModelGaugesFromWorkers(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	reg := prometheus.NewRegistry()
	d := New(Config{}, nc, nil, reg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	t.Cleanup(func() { cancel(); <-done })
	if got := gauges(t, reg); len(got) != 0 {
		t.Fatalf("gauges %v with no registry and no worker", got)
	}
	loraWorker(t, nc, "w", 4, 2, "ad")
	testenv.WaitFor(t, 2*time.Second, wantGauges(t, reg, map[string]float64{
		"queue_depth{b}": 0, "queue_depth{ad}": 0, "workers{b}": 1, "running{b}": 0,
	}))
}

var _ Registry = (*registry.Cache)(nil)
