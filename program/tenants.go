package program

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/auth"
	"github.com/tokenbus/tokenbus/dispatcher"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/usage"
	"github.com/tokenbus/tokenbus/workers"
)

// authAdmitter admits a dispatcher's tenant requests exactly as the gateway
// admits HTTP ones: the same reservation (auth.AdmissionOf) and the same
// limiter script, so a key's RPM and TPM count both front ends together.
type authAdmitter struct{ a *auth.Auth }

// Admit implements dispatcher.Admitter. A request sent again after its
// worker failed is let in on its first admission (auth.Auth.Readmit), not
// counted again; every admission is kept under its request id for that.
func (x authAdmitter) Admit(ctx context.Context, k registry.Key, req *schemas.Request, at dispatcher.Attempt) (dispatcher.Admission, error) {
	if at.Again {
		if d, ok := x.a.Readmit(ctx, k, at.RequestID); ok {
			return dispatcher.Admission{Reserved: d.Reserved, Window: d.Window}, nil
		}
	}
	adm := x.a.AdmissionOf(req)
	adm.RequestID = at.RequestID
	d, err := x.a.Admit(ctx, k, adm)
	if err != nil { // a *schemas.Error: 429, or 503 when limits fail closed
		return dispatcher.Admission{}, err
	}
	return dispatcher.Admission{Reserved: d.Reserved, Window: d.Window}, nil
}

// tenantAdmitter is the admission of a standalone dispatcher's tenant
// requests on store, with the limits configuration of a gateway (Redis
// breaker, fail open or closed, default reservation).
func tenantAdmitter(store *registry.Store, cache *registry.Cache, lim LimitsConfig, reg prometheus.Registerer, log *slog.Logger) dispatcher.Admitter {
	if store.Breaker() == nil {
		store.UseBreaker(newBreaker(lim.Breaker, reg, log))
	}
	acfg := auth.Config{Limiter: registry.NewLimiter(store), Log: log, FailClosed: lim.FailClosed,
		DefaultMaxTokens: lim.DefaultMaxTokens}
	if cache != nil {
		acfg.MaxTokens = func(model string) int { m, _ := cache.Get(model); return m.MaxModelLen }
	}
	return authAdmitter{auth.New(acfg)}
}

// workerUsage is a worker's usage log: the records of the tenant requests
// it served go to JetStream (usage.Publisher), so a Redis outage or a
// gateway restart loses none.
type workerUsage struct{ pub *usage.Publisher }

// Record implements workers.UsageSink.
func (u workerUsage) Record(rec schemas.UsageRecord) { u.pub.Publish(rec) }

var _ workers.UsageSink = workerUsage{}

// startWorkerUsage starts the publisher of worker p; stopWorkerUsage
// flushes it at shutdown.
func (p *workerRun) startWorkerUsage(source string, reg prometheus.Registerer, log *slog.Logger) (workers.UsageSink, error) {
	pub, err := usage.NewPublisher(p.nc, usage.PublisherConfig{Source: source, Log: log, Metrics: reg})
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); pub.Run(ctx) }()
	p.stopUsage = func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := pub.Flush(fctx); err != nil {
			log.Warn("usage records still unpublished at shutdown", "records", pub.Pending())
		}
		stop()
		<-done
	}
	return workerUsage{pub}, nil
}
