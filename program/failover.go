package program

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/client"
)

// failoverMetrics counts a gateway client's retries, migrations and failed
// migrations by reason (client.Options.OnFailover). Registered once per
// registry: programs that share one (dev) share the counters. Every reason
// has its series from start-up, at 0: a counter that appears only at its
// first event cannot be told from one the product lacks.
func failoverMetrics(reg prometheus.Registerer) func(client.Failover) {
	vec := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"reason"})
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if old, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
					return old
				}
			}
		}
		for _, r := range client.Reasons() {
			c.WithLabelValues(r)
		}
		return c
	}
	retries := vec("tokenbus_client_retries_total", "Requests sent again to another worker before their first token, by why the worker failed them.")
	migrations := vec("tokenbus_client_migrations_total", "Streams continued on another worker mid-stream, by why the worker failed them.")
	failed := vec("tokenbus_client_migrations_failed_total", "Streams whose worker failed and that could not be sent again (limit reached, too long, n > 1...): they failed, by why the worker failed them.")
	return func(ev client.Failover) {
		switch ev.Kind {
		case client.FailoverRetry:
			retries.WithLabelValues(ev.Reason).Inc()
		case client.FailoverMigration:
			migrations.WithLabelValues(ev.Reason).Inc()
		case client.FailoverFailed:
			failed.WithLabelValues(ev.Reason).Inc()
		}
	}
}
