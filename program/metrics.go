package program

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenbus/tokenbus/registry"
)

// metricsServer serves /metrics for a program with no other HTTP listener
// (dispatcher, worker): the registry of the program's current run. A nil
// *metricsServer is one that is off.
type metricsServer struct {
	srv *http.Server
	ln  net.Listener
	reg atomic.Pointer[prometheus.Registry] // the current run's
}

// listenMetrics listens on addr for /metrics; "" is off (nil).
func listenMetrics(addr string) (*metricsServer, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	m := &metricsServer{ln: ln}
	m.reg.Store(prometheus.NewRegistry())
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return m.reg.Load().Gather()
	}), promhttp.HandlerOpts{}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return m, nil
}

// show makes /metrics show reg (a new run's).
func (m *metricsServer) show(reg *prometheus.Registry) {
	if m != nil {
		m.reg.Store(reg)
	}
}

// serve serves until shutdown, then returns nil.
func (m *metricsServer) serve() error {
	if err := m.srv.Serve(m.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown stops serving, letting a scrape in progress finish within 1s.
func (m *metricsServer) shutdown() {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
}

// addr is the bound address, "" when off.
func (m *metricsServer) addr() string {
	if m == nil {
		return ""
	}
	return m.ln.Addr().String()
}

// registerConnMetrics registers the state of a process's connections, for
// alerts: tokenbus_nats_connected (nc) and, when the process reads the
// registry, tokenbus_redis_up (cache). Both exist from start-up. One series
// per process: a program registers them only on a registry of its own, and
// dev for its own connection and the shared cache.
func registerConnMetrics(reg prometheus.Registerer, nc *nats.Conn, cache *registry.Cache) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tokenbus_nats_connected",
		Help: "1 while the process's NATS connection is connected, 0 while it is reconnecting or closed.",
	}, func() float64 { return boolGauge(nc.IsConnected()) }))
	if cache != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tokenbus_redis_up",
			Help: "1 when the last read of the model registry from Redis succeeded (every 10s), 0 after a failed one.",
		}, func() float64 { return boolGauge(cache.Up()) }))
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
