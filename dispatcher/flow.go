package dispatcher

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/scheduler"
	"github.com/tokenbus/tokenbus/schemas"
)

// Flow control (docs/scheduling.md): each request is classified into a
// flow (tenant, band, weight) with an estimated cost; queued requests leave
// in the scheduler's order; the real cost, from the worker's done notice,
// settles the estimate.

// flowOf reads a request's flow from its headers: those a gateway set from
// the caller's key, or (tenant requests) the dispatcher from the key. Its
// max_tokens is maxTokens (from the body), else, with fromHeader, the
// Tb-Max-Tokens a gateway set; a tenant's own Tb-Max-Tokens is not read.
func (d *Dispatcher) flowOf(r *request, h nats.Header, maxTokens int, fromHeader bool) {
	r.tenant = h.Get(schemas.HdrTenant)
	if len(r.tenant) > maxTenantLen { // a trusted sender's header; keys' tenants are shorter
		r.tenant = r.tenant[:maxTenantLen]
	}
	if b, ok := schemas.ParseBand(h.Get(schemas.HdrBand)); ok {
		r.band = b
	} else {
		r.band = schemas.BandDefault
	}
	r.weight = schemas.ParseWeight(h.Get(schemas.HdrWeight))
	if v := h.Get(schemas.HdrMaxQueue); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 {
			r.maxQueue = time.Duration(min(ms, math.MaxInt64/int64(time.Millisecond))) * time.Millisecond
		}
	}
	if maxTokens <= 0 && fromHeader {
		if v := h.Get(schemas.HdrMaxTokens); v != "" {
			maxTokens, _ = strconv.Atoi(v)
		}
	}
	prompt := len(r.msg.Data) / bytesPerToken // the body, a little more than the prompt
	if r.text > 0 {
		prompt = r.text / bytesPerToken
	}
	r.cost = d.cost(prompt, maxTokens)
}

// maxTenantLen bounds the tenant a flow is named by (an API key's tenant is
// at most 256 bytes).
const maxTenantLen = 256

// cost is a request's cost in output-token units: the engine time it
// holds a slot for, about one decode step per output token, plus its
// prefill at PromptTokenCost per prompt token. An unknown output length
// counts as DefaultOutputTokens.
func (d *Dispatcher) cost(prompt, output int) float64 {
	if output <= 0 {
		output = d.cfg.DefaultOutputTokens
	}
	return float64(max(prompt, 0))*d.cfg.PromptTokenCost + float64(output)
}

// charge is what a request that left a queue was charged, kept until its
// worker's done notice says what it cost.
type charge struct {
	worker        string
	model, tenant string
	band          schemas.Band
	cost          float64
	at            time.Time
	expires       time.Time // a queued request's queue limit, which a bounce keeps
}

// maxCharges bounds the charges awaiting a done notice; past it, a
// request's estimate stands.
const maxCharges = 1 << 16

// chargeKey: a done notice names the worker and the request id. A struct,
// not a joined string: no allocation per request.
type chargeKey struct{ worker, id string }

// chargedLocked records what a request forwarded to worker was charged
// (0 for one that did not wait: its flow was not charged, but its service
// time counts).
func (d *Dispatcher) chargedLocked(worker, reqID string, c charge) {
	k := chargeKey{worker, reqID}
	if _, ok := d.charges[k]; ok || len(d.charges) >= maxCharges {
		return
	}
	c.worker = worker
	d.charges[k] = c
	d.coord.inflight[c.model]++
}

// dropChargeLocked forgets a forwarded request's charge (it ended, bounced
// or its worker was lost) and returns it.
func (d *Dispatcher) dropChargeLocked(k chargeKey) (charge, bool) {
	c, ok := d.charges[k]
	if !ok {
		return c, false
	}
	delete(d.charges, k)
	if n := d.coord.inflight[c.model] - 1; n > 0 {
		d.coord.inflight[c.model] = n
	} else {
		delete(d.coord.inflight, c.model)
	}
	return c, true
}

// settle corrects the tenant's charge for a request that completed on
// n.Worker with its real usage.
func (d *Dispatcher) settle(n schemas.DoneNotice) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.charges) == 0 {
		return
	}
	c, ok := d.dropChargeLocked(chargeKey{n.Worker, n.RequestID})
	if !ok {
		return
	}
	if n.PromptTokens == 0 && n.CompletionTokens == 0 {
		return // failed or not reported: the estimate stands
	}
	real, held := realCost(n, d.cfg.PromptTokenCost), time.Since(c.at).Seconds()
	if n.HeldMS > 0 {
		held = n.HeldMS / 1000
	}
	// Seconds of a slot per cost unit, for the capacity estimate.
	per := held / real
	if old, ok := d.svc[c.model]; ok {
		per = old + 0.1*(per-old)
	}
	d.svc[c.model] = per
	if c.cost == 0 {
		return // it did not wait: nothing was charged
	}
	if q := d.queues[c.model]; q != nil {
		q.Settle(c.tenant, c.band, real-c.cost)
	}
	d.m.settled.Observe(real / c.cost)
	d.m.flowTokens.WithLabelValues(c.band.String(), d.m.tenants.label(c.tenant)).Add(float64(n.PromptTokens + n.CompletionTokens))
}

// flowStat is one line of the queue by flow (tokenbus_dispatcher_flow_queued,
// which the console's traffic page reads): requests queued for a model in a
// band by a tenant.
type flowStat struct {
	Model, Band, Tenant string
	Queued              int
	Cost                float64 // estimated, in output-token units
}

// flowStats lists the queue by flow: per model and band, the top tenants
// by requests queued, the rest summed as "other".
func (d *Dispatcher) flowStats(top int) []flowStat {
	type key struct {
		model string
		band  schemas.Band
	}
	by := map[key][]flowStat{}
	d.mu.Lock()
	for model, q := range d.queues {
		q.Each(func(b schemas.Band, tenant string, n int, cost float64) {
			k := key{model, b}
			if tenant == "" {
				tenant = "none"
			}
			by[k] = append(by[k], flowStat{Model: model, Band: b.String(), Tenant: tenant, Queued: n, Cost: cost})
		})
	}
	d.mu.Unlock()
	var out []flowStat
	for _, fs := range by {
		slices.SortFunc(fs, func(a, b flowStat) int {
			return cmp.Or(cmp.Compare(b.Queued, a.Queued), cmp.Compare(a.Tenant, b.Tenant))
		})
		if len(fs) > top {
			other := flowStat{Model: fs[0].Model, Band: fs[0].Band, Tenant: "other"}
			for _, f := range fs[top:] {
				other.Queued += f.Queued
				other.Cost += f.Cost
			}
			fs = append(fs[:top], other)
		}
		out = append(out, fs...)
	}
	slices.SortFunc(out, func(a, b flowStat) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Band, b.Band), cmp.Compare(b.Queued, a.Queued))
	})
	return out
}

// realCost is what a request that ended really cost, in output-token
// units: the engine time it held its slot, measured in its own decode steps
// (its completion tokens, plus its prefill time over its time per output
// token), when the worker timed a stream; else its tokens, a prompt token at
// promptCost.
func realCost(n schemas.DoneNotice, promptCost float64) float64 {
	out := float64(n.CompletionTokens)
	if out > 0 && n.PrefillMS > 0 && n.HeldMS > n.PrefillMS {
		perToken := (n.HeldMS - n.PrefillMS) / out
		return out + n.PrefillMS/perToken
	}
	return float64(n.PromptTokens)*promptCost + out
}

// forgetChargesLocked drops the charges of requests on workers just lost,
// and any older than an hour (a done notice lost on the way).
func (d *Dispatcher) forgetChargesLocked(now time.Time, lost []string) {
	if len(lost) == 0 && now.Sub(d.chargesSwept) < time.Minute {
		return
	}
	d.chargesSwept = now
	for k, c := range d.charges {
		if now.Sub(c.at) > time.Hour || slices.Contains(lost, c.worker) {
			d.dropChargeLocked(k)
		}
	}
}

// capacityLocked tells model's queue what its workers can serve (cost units
// per second): their slots over the measured slot time per cost unit.
func (d *Dispatcher) capacityLocked(model string, q *scheduler.Queue) {
	per, ok := d.svc[model]
	if !ok || per <= 0 {
		return
	}
	slots := 0
	for _, w := range d.fleet.Workers() {
		if w.Healthy && !w.Draining && slices.Contains(w.Models, model) {
			slots += w.MaxConcurrency
		}
	}
	q.SetCapacity(float64(slots) / per)
}

// serviceTimeLocked is how long a request of cost holds a slot of model's
// workers, by the measured slot time per cost unit; 0 while unknown.
func (d *Dispatcher) serviceTimeLocked(model string, cost float64) time.Duration {
	return time.Duration(d.svc[model] * cost * float64(time.Second))
}

// queueFor is model's queue, made on first use.
func (d *Dispatcher) queueFor(model string) *scheduler.Queue {
	q := d.queues[model]
	if q == nil {
		q = scheduler.New(scheduler.Config{MaxQueued: d.cfg.QueueSize})
		d.queues[model] = q
		d.capacityLocked(model, q) // then every sweep (capacityLocked reads the fleet)
	}
	return q
}

// retryAfter turns an estimated wait into Retry-After seconds: at least 1,
// at most a minute.
func retryAfter(wait time.Duration) int {
	return int(min(max(math.Ceil(wait.Seconds()), 1), 60))
}
