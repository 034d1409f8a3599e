package dispatcher

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/scheduler"
	"github.com/tokenbus/tokenbus/schemas"
)

// Registry is the model registry as a dispatcher reads it; registry.Cache
// implements it.
//
// Known tells whether a model is known at all, which decides between 404
// (unknown) and 503 (known, but no worker up).
//
// Get turns on adapter-aware routing: an entry with a Base is a LoRA adapter
// on that base model, with its weights at Path; a request for it goes to a
// worker of its base model, preferably one that has it loaded (see
// fleet.Fleet.AcquireAdapter), and carries the adapter's base and path so
// that the worker can load it.
//
// Models lists every registered model and adapter: each has a series in the
// per-model gauges from start-up (0 queued, 0 workers), so that a model
// registered with no worker up shows as such.
type Registry interface {
	Known(model string) bool
	Get(name string) (registry.Model, bool)
	Models() []registry.Model
}

// adapterRef is a LoRA adapter as a request for it is routed.
type adapterRef struct {
	base, path string
}

// Config tunes a Dispatcher. Zero values take the defaults shown.
type Config struct {
	ID           string        // default: a random id
	QueueSize    int           // per model; default 1024
	QueueTimeout time.Duration // longest wait in a queue; default 60s
	MaxBounces   int           // workers a request may bounce off before it queues; default 3
	SweepEvery   time.Duration // expiry scan period; default 100ms (a dead worker is noticed within 3 heartbeats plus this)
	// ReplyPrefixes are the subject prefixes a request's reply subject must
	// have; default ["_INBOX."]. Replies go wherever a request says, so
	// without this a client could aim a dispatcher's or worker's messages at
	// any subject those are allowed to publish to (a worker's control
	// subjects, say).
	ReplyPrefixes []string
	// Embedded: the dispatcher runs inside a gateway, which hands it requests
	// with Submit; it does not join the queue group on the request subjects
	// (standalone dispatchers serve NATS-native clients).
	Embedded bool
	// AdapterSpill: see fleet.Fleet.AdapterSpill; default 0.5.
	AdapterSpill float64
	// Prefix-aware routing (docs/routing.md): chat and completion requests
	// go where their prompt's prefix is probably cached, balanced against
	// load. PrefixBlockBytes is the prompt text one hashed block covers
	// (default 64, about 16 tokens; rounded down to a multiple of 8);
	// NoPrefixRouting turns it off (least-loaded routing only).
	// CacheWeight and KVWeight: see fleet.Fleet; defaults 1 and 0.25 (a
	// negative KVWeight: 0, KV use does not count).
	PrefixBlockBytes      int
	NoPrefixRouting       bool
	CacheWeight, KVWeight float64
	// Keys looks up the API keys of tenant requests (TenantReqPrefix); nil:
	// tenant requests are dropped. Admit checks their limits; nil: none.
	// KeyTimeout bounds each of the two; default 2s.
	Keys       Keys
	Admit      Admitter
	KeyTimeout time.Duration
	// Placement: adapter placement by demand (placement.go); off by default.
	Placement PlacementConfig
	// Local hands requests to the workers in this process (dev) in memory
	// instead of publishing them; nil: every request goes on the bus.
	Local LocalWorkers
	// Flow control's cost estimate (flow.go): a prompt token costs
	// PromptTokenCost output tokens (default 1/32: a prefill token is that
	// much cheaper than a decode step), and a request with no max_tokens
	// counts DefaultOutputTokens (default 256) until its real usage settles it.
	PromptTokenCost     float64
	DefaultOutputTokens int
	// Capacity on demand (hold.go, docs/capacity.md): a request for a
	// registered model that no live worker serves waits up to
	// ColdStartTimeout (default 5m, never past its deadline) for one to
	// start, wake or switch. HoldBeat (default 1s) is how often queued
	// requests get their queued frame again, and held models their demand
	// event.
	ColdStartTimeout time.Duration
	HoldBeat         time.Duration
	// Disagg is the prefill/decode disaggregation policy (disagg.go).
	Disagg DisaggConfig
}

// LocalWorkers takes requests for the workers that run in this process
// (dev), past the bus.
type LocalWorkers interface {
	// Take hands m, a request for worker, to that worker as its work
	// subject would, and reports whether it did: false when the worker is
	// not in this process or not taking requests (the bus then answers for
	// it). It never blocks.
	Take(worker string, m *nats.Msg) bool
}

func (c *Config) defaults() {
	if c.ID == "" {
		c.ID = "d-" + nuid.Next()[:10]
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 1024
	}
	if c.QueueTimeout <= 0 {
		c.QueueTimeout = 60 * time.Second
	}
	if c.MaxBounces <= 0 {
		c.MaxBounces = 3
	}
	if c.SweepEvery <= 0 {
		c.SweepEvery = 100 * time.Millisecond
	}
	if len(c.ReplyPrefixes) == 0 {
		c.ReplyPrefixes = []string{"_INBOX."}
	}
	if c.AdapterSpill <= 0 {
		c.AdapterSpill = 0.5
	}
	c.Placement.defaults()
	if c.KeyTimeout <= 0 {
		c.KeyTimeout = defaultKeyTimeout
	}
	if c.PromptTokenCost <= 0 {
		c.PromptTokenCost = 1.0 / 32
	}
	if c.DefaultOutputTokens <= 0 {
		c.DefaultOutputTokens = 256
	}
	if c.ColdStartTimeout <= 0 {
		c.ColdStartTimeout = 5 * time.Minute
	}
	if c.HoldBeat <= 0 {
		c.HoldBeat = time.Second
	}
	if c.PrefixBlockBytes < 8 {
		c.PrefixBlockBytes = 64
	}
	if c.CacheWeight <= 0 {
		c.CacheWeight = 1
	}
	if c.KVWeight < 0 {
		c.KVWeight = 0
	} else if c.KVWeight == 0 {
		c.KVWeight = 0.25
	}
}

// Dispatcher is one dispatcher replica.
type Dispatcher struct {
	cfg    Config
	nc     *nats.Conn
	models Registry // nil: every model with no worker is unknown, and no adapter routing
	log    *slog.Logger
	fleet  *fleet.Fleet
	failed failures // requests whose last attempt a worker failed (admit.go)
	m      *metrics
	demand *demand // requests per adapter: for placement and for the choice of a worker to evict on

	switches switchAsks // model switches asked of workers (switch.go)

	ready   chan struct{} // closed once Run has subscribed
	started time.Time     // when Run subscribed: the fleet fills in the first heartbeat interval

	mu           sync.Mutex
	coord        coord                       // with the other dispatchers sharing the workers (coord.go)
	queues       map[string]*scheduler.Queue // by model: flow control's order (flow.go)
	byID         map[string]*queued          // by queueKey: request id and cancel token
	charges      map[chargeKey]charge        // by chargeKey: what forwarded requests were charged, until done
	svc          map[string]float64          // by model: seconds of a slot per cost unit, measured (flow.go)
	chargesSwept time.Time
	// adapterQueues lists, by base model, the adapters that have a queue, so
	// that a worker of the base freeing a slot drains them too.
	adapterQueues map[string]map[string]struct{}
	held          map[string]*holdState // models with requests held for capacity (hold.go)
	beatAt        time.Time             // the last round of queued frames sent again (hold.go)
}

// New makes a dispatcher; Run starts it. models may be nil: every model with
// no worker is then unknown, and adapters are not routed as such.
func New(cfg Config, nc *nats.Conn, models Registry, reg prometheus.Registerer, log *slog.Logger) *Dispatcher {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Dispatcher{cfg: cfg, nc: nc, models: models, log: log.With("dispatcher", cfg.ID),
		fleet: fleet.New(), m: newMetrics(), ready: make(chan struct{}), queues: map[string]*scheduler.Queue{}, byID: map[string]*queued{}, charges: map[chargeKey]charge{}, svc: map[string]float64{}, coord: newCoord(),
		adapterQueues: map[string]map[string]struct{}{}, held: map[string]*holdState{}}
	d.fleet.AdapterSpill = cfg.AdapterSpill
	// Requests per adapter are counted with placement off too: routing
	// sends a load that must evict to the worker with the coldest adapter.
	d.demand = newDemand(cfg.Placement)
	d.fleet.AdapterRate = d.demand.rate
	d.fleet.CacheWeight, d.fleet.KVWeight = cfg.CacheWeight, cfg.KVWeight
	d.fleet.BlockTokens = max(cfg.PrefixBlockBytes/bytesPerToken, 1)
	d.register(reg)
	return d
}

// ID is the dispatcher's id.
func (d *Dispatcher) ID() string { return d.cfg.ID }

// Ready is closed once the dispatcher takes requests.
func (d *Dispatcher) Ready() <-chan struct{} { return d.ready }

// Fleet is the dispatcher's live view of the workers, which it routes on.
func (d *Dispatcher) Fleet() *fleet.Fleet { return d.fleet }

// Run serves until ctx ends. Requests still queued then are answered 503 so
// their clients can retry elsewhere at once.
func (d *Dispatcher) Run(ctx context.Context) error {
	type subSpec struct {
		subject, queue string
		h              nats.MsgHandler
	}
	specs := []subSpec{
		{schemas.HeartbeatPrefix + "*", "", d.onHeartbeat},
		{schemas.DonePrefix + "*", "", d.onDone},
		{schemas.QueueCancel, "", d.onQueueCancel},
		{schemas.BounceSubject(d.cfg.ID), "", d.onBounce},
		{schemas.FlowsPrefix + "*", "", d.onFlows},
	}
	if !d.cfg.NoPrefixRouting {
		specs = append(specs, subSpec{schemas.KVEventsPrefix + "*", "", d.onKVEvents})
	}
	if !d.cfg.Embedded {
		specs = append(specs, subSpec{schemas.ReqPrefix + ">", schemas.DispatcherQueue, d.onRequest},
			subSpec{schemas.TenantReqPrefix + ">", schemas.DispatcherQueue, d.onRequest})
	}
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	for _, sp := range specs {
		var s *nats.Subscription
		var err error
		if sp.queue != "" {
			s, err = d.nc.QueueSubscribe(sp.subject, sp.queue, sp.h)
		} else {
			s, err = d.nc.Subscribe(sp.subject, sp.h)
		}
		if err != nil {
			return err
		}
		_ = s.SetPendingLimits(1<<20, 1<<30)
		subs = append(subs, s)
	}
	if err := d.nc.Flush(); err != nil {
		return err
	}
	d.mu.Lock()
	d.started = time.Now()
	d.mu.Unlock()
	close(d.ready)
	d.log.Info("dispatcher up")
	if d.cfg.Placement.On {
		placed := make(chan struct{})
		pctx, stop := context.WithCancel(ctx)
		go func() { defer close(placed); d.place(pctx) }()
		defer func() { stop(); <-placed }()
	}
	t := time.NewTicker(d.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Stop taking requests first, then turn away what is queued.
			if !d.cfg.Embedded {
				_ = subs[len(subs)-1].Unsubscribe()
				_ = subs[len(subs)-2].Unsubscribe()
			}
			d.rejectAll(schemas.ErrShuttingDown.New("dispatcher"))
			return d.nc.Flush()
		case now := <-t.C:
			d.sweep(now)
		}
	}
}

func (d *Dispatcher) onHeartbeat(m *nats.Msg) {
	hb, joined, ok := d.fleet.Heartbeat(m.Data, time.Now())
	switch {
	case !ok:
		d.log.Warn("bad heartbeat", "subject", m.Subject)
		return
	case hb.Draining && hb.Running == 0:
		return // it left the fleet
	case joined:
		d.m.joined.Inc()
		d.log.Info("worker joined", "worker", hb.Worker, "models", hb.Models, "max_concurrency", hb.MaxConcurrency)
	}
	d.drain(hb.Models)
}

// onKVEvents applies a worker's prefix-cache events to the fleet's record
// (fleet.Fleet.KVEvents): they take precedence over our own guesses.
func (d *Dispatcher) onKVEvents(m *nats.Msg) {
	if d.fleet.KVEvents(m.Data, d.cfg.PrefixBlockBytes) {
		d.m.kvEvents.Inc()
	}
}

func (d *Dispatcher) onDone(m *nats.Msg) {
	n, ok := d.fleet.Done(m.Data)
	if !ok {
		return
	}
	d.failed.record(n)
	d.settle(n)
	d.drain(d.fleet.ModelsOf(n.Worker))
}

// onQueueCancel takes a request out of the queue. Its body is
// schemas.CancelBody: the request id and the cancel token its owner got in
// the queued frame. A cancel that matches nothing queued here (a wrong
// token, or a request queued in another dispatcher or gone) is ignored.
func (d *Dispatcher) onQueueCancel(m *nats.Msg) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.byID[string(m.Data)]; e != nil { // the body is the queue key: no allocation
		d.unqueueLocked(e)
		endSpan(e.span, "", nil, "cancelled")
		return
	}
	d.m.cancelsIgnored.Inc()
}

// queueKey is the key of a queued request in byID: the cancel body that
// takes it out. Two requests with one id (from two tenants, say) are two
// entries; a bounced request comes back with its token and finds its own.
func queueKey(id, token string) string { return id + " " + token }

// request is what the dispatcher reads of a request message.
type request struct {
	msg      *nats.Msg
	id       string
	model    string
	priority int
	deadline time.Time
	attempt  int
	// Its flow (flow.go): tenant, band, weight, its key's longest queue
	// wait (0: QueueTimeout), and its estimated cost.
	tenant   string
	band     schemas.Band
	weight   int
	maxQueue time.Duration
	cost     float64
	// expires: a bounced request keeps the limit it was first queued with
	// (zero: not queued before).
	expires time.Time
	adapter *adapterRef // a registered LoRA adapter: its base and path
	span    trace.Span  // the dispatch span (startSpan)
	hashes  []uint64    // the prompt's chained block hashes (prefix.go); nil: route by load
	text    int         // with hashes: the prompt text's length in bytes (for the prediction)
}

// bytesPerToken is how many bytes of prompt text a token stands for, on
// average, in English with the usual BPE vocabularies: it turns block counts
// into token estimates.
const bytesPerToken = 4

// resolve looks the requested model up in the registry: a LoRA adapter
// comes back with its base and path, anything else as nil.
func (d *Dispatcher) resolve(model string) *adapterRef {
	if d.models == nil {
		return nil
	}
	m, ok := d.models.Get(model)
	if !ok || !m.IsAdapter() || m.Base == model {
		return nil
	}
	return &adapterRef{base: m.Base, path: m.Path}
}

// acquire picks a worker for a request: adapter-aware for an adapter,
// prefix-aware for a prompt with hashes.
func (d *Dispatcher) acquire(model string, ad *adapterRef, hashes []uint64, exclude string) (id string, serving, cached int, ok bool) {
	if ad == nil {
		id, serving, cached, ok = d.fleet.AcquirePrefix(model, exclude, hashes)
	} else {
		var how fleet.Placement
		id, serving, how, cached, ok = d.fleet.AcquireAdapterPrefix(model, ad.base, exclude, hashes, time.Now())
		if ok {
			d.m.adapterRouted.WithLabelValues(how.String()).Inc()
		}
	}
	if ok && len(hashes) > 0 {
		d.m.prefixRouted(cached, len(hashes), d.cfg.PrefixBlockBytes)
	}
	return id, serving, cached, ok
}

// predict is the prediction for a request routed with hashes (none for one
// routed by load alone).
func (d *Dispatcher) predict(cached int, hashes []uint64, text int) prediction {
	if len(hashes) == 0 {
		return prediction{}
	}
	return predict(cached, d.cfg.PrefixBlockBytes, text)
}

// parse reads the headers of a request for model: the model its subject
// names (or, on a bounce, the Tb-Model header a dispatcher set).
func (d *Dispatcher) parse(m *nats.Msg, model string) (*request, *schemas.Error) {
	h := m.Header
	r := &request{msg: m, id: h.Get(schemas.HdrRequestID), model: model}
	r.priority = schemas.ParsePriority(h.Get(schemas.HdrPriority))
	r.deadline = schemas.ParseDeadline(h.Get(schemas.HdrDeadline))
	if a := h.Get(schemas.HdrAttempt); a != "" { // usually absent: Atoi("") allocates its error
		r.attempt, _ = strconv.Atoi(a)
	}
	switch {
	case !schemas.ValidRequestID(r.id):
		return nil, schemas.ErrBadHeader.New(schemas.HdrRequestID)
	case !schemas.Kind(h.Get(schemas.HdrKind)).Valid():
		return nil, schemas.ErrBadHeader.New(schemas.HdrKind + " (chat, completion, embedding, tokenize or detokenize)")
	case r.model == "":
		return nil, schemas.ErrBadHeader.At("model", schemas.HdrModel)
	}
	if hm := h.Get(schemas.HdrModel); hm != "" && hm != r.model {
		return nil, schemas.ErrModelMismatch.New(r.model, "the "+schemas.HdrModel+" header", hm)
	}
	r.adapter = d.resolve(r.model)
	if r.adapter != nil && r.attempt == 0 {
		d.demand.observe(r.model, r.adapter, time.Now())
	}
	if k := schemas.Kind(h.Get(schemas.HdrKind)); k == schemas.KindChat || k == schemas.KindCompletion {
		switch {
		case !d.cfg.NoPrefixRouting:
			r.hashes, r.text = promptKey(nil, r.model, m.Data, d.cfg.PrefixBlockBytes)
		case d.cfg.Disagg.MinPromptTokens > 0: // disaggregation decides on the prompt's length
			r.text = len(schemas.PromptSpan(m.Data))
		}
	}
	return r, nil
}

// Submit routes a request handed over in-process, as if it had arrived on
// its request subject: a gateway with an embedded dispatcher publishes
// straight to the chosen worker, saving two NATS traversals on the way to
// the first token. Answers (queued, errors) go to m.Reply as usual.
func (d *Dispatcher) Submit(m *nats.Msg) error {
	d.take(m, false) // the gateway has read the body
	return nil
}

// onRequest takes a request published on a request subject: from a
// NATS-native client, whose body nobody has read yet.
func (d *Dispatcher) onRequest(m *nats.Msg) { d.take(m, true) }

// take routes a request; with readBody (a message from NATS), its body is
// read first (the one reader, schemas.ReadRequestFor): a bad body is
// answered 400 here instead of travelling to a worker, and the body's
// priority counts when the request has no Tb-Priority header.
//
// The subject is the authority on the model: a Tb-Model header or a body
// "model" that names another is 400 model_mismatch. A request from NATS has
// every header only dispatchers may set removed first; a tenant request
// (TenantReqPrefix) is admitted for its API key (tenant.go). Every request
// gets a cancel token: a message from NATS a new one, one handed over
// in-process (Submit) keeps the one its gateway set.
func (d *Dispatcher) take(m *nats.Msg, readBody bool) {
	if m.Reply == "" {
		return
	}
	var (
		model  string
		key    registry.Key
		tenant bool
	)
	if keyID, mdl, ok := schemas.ParseTenantReqSubject(m.Subject); ok && readBody {
		if key, ok = d.tenantKey(keyID); !ok {
			return
		}
		if !tenantReplyAllowed(m.Reply, key.Tenant) {
			d.m.rejected.WithLabelValues("bad_reply_subject").Inc()
			d.log.Warn("dropping a tenant request whose reply subject is outside its tenant's inbox or too long",
				"reply", schemas.Clip(m.Reply, schemas.MaxQuoted), "key_id", key.ID, "tenant", key.Tenant,
				"request_id", schemas.Clip(m.Header.Get(schemas.HdrRequestID), schemas.MaxQuoted))
			return
		}
		model, tenant = mdl, true
	} else {
		if !d.replyAllowed(m.Reply) {
			d.m.rejected.WithLabelValues("bad_reply_subject").Inc()
			d.log.Warn("dropping a request whose reply subject is outside the allowed prefixes or too long",
				"reply", schemas.Clip(m.Reply, schemas.MaxQuoted),
				"request_id", schemas.Clip(m.Header.Get(schemas.HdrRequestID), schemas.MaxQuoted),
				"trace_id", schemas.Clip(tracing.HeaderTraceID(m.Header), schemas.MaxQuoted))
			return
		}
		model, _ = schemas.ModelFromReqSubject(m.Subject)
	}
	if readBody {
		stripDispatcherHeaders(m.Header, tenant)
	}
	r, err := d.parse(m, model)
	if err != nil {
		d.reject(m.Reply, err)
		return
	}
	if readBody {
		view, err := schemas.ReadRequestFor(schemas.Kind(m.Header.Get(schemas.HdrKind)), m.Data, r.model)
		if err != nil {
			d.reject(m.Reply, err)
			return
		}
		if tenant {
			if err := d.admitTenant(m, key, view); err != nil {
				d.reply(m.Reply, err)
				return
			}
		}
		if m.Header.Get(schemas.HdrPriority) == "" && view.Priority != 0 {
			r.priority = view.Priority
			m.Header.Set(schemas.HdrPriority, strconv.Itoa(view.Priority))
		}
		d.flowOf(r, m.Header, view.MaxTokens, false) // the key's flow (admitTenant), the body's max_tokens
		m.Header[schemas.HdrCancelToken] = []string{schemas.NewCancelToken()}
	} else {
		d.flowOf(r, m.Header, 0, true) // the gateway's headers: it read the body
		if m.Header.Get(schemas.HdrCancelToken) == "" {
			m.Header[schemas.HdrCancelToken] = []string{schemas.NewCancelToken()}
		}
	}
	// The worker (and a bounce) cannot read the model from the subject.
	m.Header.Set(schemas.HdrModel, r.model)
	d.startSpan(r)
	d.route(r, clientExclude(m.Header))
}

// clientExclude is the Tb-Exclude list of a request sent again after its
// worker failed: workers to avoid (only to avoid: a client never chooses).
// An over-long list is ignored.
func clientExclude(h nats.Header) string {
	x := h.Get(schemas.HdrExclude)
	if len(x) > schemas.MaxExclude {
		return ""
	}
	return x
}

// reject answers a request that cannot be read, counting it.
func (d *Dispatcher) reject(reply string, e *schemas.Error) {
	reason := "bad_request"
	if schemas.ErrModelMismatch.Is(e) {
		reason = "model_mismatch"
	}
	d.m.rejected.WithLabelValues(reason).Inc()
	d.reply(reply, e)
}

func (d *Dispatcher) replyAllowed(reply string) bool {
	if len(reply) > schemas.MaxReplyLen {
		return false
	}
	for _, p := range d.cfg.ReplyPrefixes {
		if strings.HasPrefix(reply, p) {
			return true
		}
	}
	return false
}

// onBounce takes back a request that a full worker could not admit.
func (d *Dispatcher) onBounce(m *nats.Msg) {
	// Only workers publish here, with the headers this dispatcher set: the
	// model is the Tb-Model it wrote.
	r, err := d.parse(m, m.Header.Get(schemas.HdrModel))
	if err != nil || m.Reply == "" || !d.replyAllowed(m.Reply) { // as onRequest: frames go only to client inboxes
		return
	}
	d.m.bounces.Inc()
	d.flowOf(r, m.Header, 0, true) // the headers this dispatcher forwarded it with
	r.attempt++
	m.Header.Set(schemas.HdrAttempt, strconv.Itoa(r.attempt))
	d.startSpan(r)
	from := m.Header.Get(schemas.HdrWorker)
	if pw := m.Header.Get(schemas.HdrPrefillWorker); pw != "" {
		d.fleet.Release(pw) // the decode worker bounced it before sending the prefill
		m.Header.Del(schemas.HdrPrefillWorker)
	}
	if from != "" {
		d.fleet.MarkFull(from)
		d.mu.Lock()
		if c, ok := d.dropChargeLocked(chargeKey{from, r.id}); ok {
			r.expires = c.expires
			if q := d.queues[c.model]; q != nil && c.cost > 0 {
				q.Settle(c.tenant, c.band, -c.cost) // not served: its charge is refunded
			}
		}
		d.mu.Unlock()
	}
	if r.attempt > d.cfg.MaxBounces {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.enqueueLocked(r)
		return
	}
	exclude := clientExclude(m.Header)
	switch {
	case exclude == "":
		exclude = from
	case from != "":
		exclude = from + "," + exclude
	}
	d.route(r, exclude)
}

func (d *Dispatcher) route(r *request, exclude string) {
	if !r.deadline.IsZero() && time.Now().After(r.deadline) {
		d.fail(r.span, r.msg.Reply, schemas.ErrDeadlinePassed.New("before it was routed"))
		return
	}
	d.mu.Lock()
	// Requests already waiting for this model go first, here or at another
	// dispatcher sharing its workers (coord.go).
	if q := d.queues[r.model]; (q != nil && q.Len() > 0) || d.coordinatedLocked(r.model) {
		d.enqueueLocked(r)
		d.mu.Unlock()
		d.drain([]string{r.model})
		return
	}
	id, serving, cached, ok := d.acquire(r.model, r.adapter, r.hashes, exclude)
	if ok {
		pw := d.choosePrefill(prompt{r.model, r.adapter, r.msg.Header, r.hashes, r.text}, cached, exclude)
		d.chargedLocked(id, r.id, charge{model: r.model, at: time.Now()}) // its service time counts for the capacity estimate
		d.mu.Unlock()
		d.forward(r.msg, id, r.adapter, r.span, d.predict(cached, r.hashes, r.text), pw)
		return
	}
	if serving == 0 && exclude == "" && !d.warmingLocked(time.Now()) && !d.holdable(r.model, r.adapter) {
		d.mu.Unlock()
		d.m.rejected.WithLabelValues("no_worker").Inc()
		d.fail(r.span, r.msg.Reply, d.noWorker(r.model, r.adapter))
		return
	}
	d.enqueueLocked(r)
	d.mu.Unlock()
}

// noWorker is the answer for a model no live worker serves and that cannot
// be held for capacity: 404, or 503 for an adapter whose base is served by
// none (or, with no registry, a model lost while requests waited).
func (d *Dispatcher) noWorker(model string, adapter *adapterRef) *schemas.Error {
	if adapter != nil {
		return schemas.ErrNoWorkerForBase.New(adapter.base, model)
	}
	if d.models != nil && d.models.Known(model) {
		return schemas.ErrNoWorker.New(model)
	}
	return schemas.ErrModelNotFound.New(model)
}

// warmingLocked reports whether the dispatcher started too recently to have
// heard every worker's heartbeat: a request for a model with no worker then
// waits in the queue instead of being refused at once.
func (d *Dispatcher) warmingLocked(now time.Time) bool {
	return now.Sub(d.started) < warmUp
}

// warmUp is two heartbeat intervals (workers beat every second by default).
const warmUp = 2 * time.Second

func (d *Dispatcher) enqueueLocked(r *request) {
	now := time.Now()
	q := d.queueFor(r.model)
	if r.adapter != nil {
		as := d.adapterQueues[r.adapter.base]
		if as == nil {
			as = map[string]struct{}{}
			d.adapterQueues[r.adapter.base] = as
		}
		as[r.model] = struct{}{}
	}
	token := r.msg.Header.Get(schemas.HdrCancelToken)
	qk := queueKey(r.id, token)
	if old := d.byID[qk]; old != nil {
		d.unqueueLocked(old) // the same request bounced back: keep one entry
		endSpan(old.span, "", nil, "superseded")
	}
	limit := d.cfg.QueueTimeout
	cold := d.serving(r.model, r.adapter) == 0 && d.holdable(r.model, r.adapter)
	if cold {
		limit = d.cfg.ColdStartTimeout // nothing to estimate: it waits for capacity to come up
	}
	if r.maxQueue > 0 {
		limit = min(limit, r.maxQueue)
	}
	expires := now.Add(limit)
	if !r.deadline.IsZero() && r.deadline.Before(expires) {
		expires = r.deadline
	}
	if !r.expires.IsZero() && r.expires.Before(expires) {
		expires = r.expires // bounced: its first queueing's limit stands
	}
	if !expires.After(now) && cold {
		d.m.rejected.WithLabelValues("queue_timeout").Inc()
		d.fail(r.span, r.msg.Reply, schemas.ErrColdStartTimeout.New(r.model, "its deadline"))
		return
	}
	if !expires.After(now) {
		d.m.refused(r.band, r.tenant, "queue_timeout")
		d.m.rejected.WithLabelValues("queue_timeout").Inc()
		d.fail(r.span, r.msg.Reply, schemas.ErrQueueTimeout.New("model `"+r.model+"`"))
		return
	}
	// Refuse at once what cannot start in time, instead of letting it wait
	// in vain (flow control: the estimate is the measured service rate over
	// the cost that goes first).
	wait, ahead, known := q.Estimate(r.tenant, r.band, float64(r.weight), r.cost, now)
	// Slots free one request at a time, not as a fluid: the start can come
	// up to one service time after the estimate (a batch of equal requests
	// frees its slots together). Refuse what might miss its limit so.
	if known && !cold && now.Add(wait+d.serviceTimeLocked(r.model, r.cost)).After(expires) {
		d.m.refused(r.band, r.tenant, "wait_too_long")
		d.m.rejected.WithLabelValues("wait_too_long").Inc()
		e := schemas.ErrQueueWaitTooLong.New(r.model, wait.Round(time.Millisecond).String(), expires.Sub(now).Round(time.Millisecond).String())
		d.fail(r.span, r.msg.Reply, e.WithRetryAfter(retryAfter(wait)))
		return
	}
	e := &queued{msg: r.msg, id: qk, reqID: r.id, model: r.model, adapter: r.adapter, hashes: r.hashes, text: r.text, span: r.span,
		cold: cold, beatAt: now}
	weight, fresh := d.flowWeightLocked(r.model, r.tenant, r.band, float64(r.weight))
	e.item = scheduler.Item{Flow: r.tenant, Band: r.band, Weight: weight, Priority: r.priority,
		Cost: r.cost, Expires: expires, Value: e}
	evicted, err := q.Push(&e.item, now)
	if fresh && err == nil {
		defer d.announceLocked(now, true) // other dispatchers learn of a new flow at once
	}
	if err != nil {
		d.m.refused(r.band, r.tenant, "queue_full")
		d.m.rejected.WithLabelValues("queue_full").Inc()
		d.fail(r.span, r.msg.Reply, schemas.ErrQueueFull.New(r.model))
		return
	}
	if evicted != nil { // a tenant holding more of the full queue than its share made room
		old := evicted.Value.(*queued)
		delete(d.byID, old.id)
		d.m.refused(evicted.Band, evicted.Flow, "evicted")
		d.m.rejected.WithLabelValues("queue_full").Inc()
		d.fail(old.span, old.msg.Reply, schemas.ErrQueueFull.New(r.model))
	}
	d.byID[qk] = e
	spanQueued(r.span, ahead+1)
	if cold {
		wait, ahead = 0, q.Len()-1
		d.heldLocked(r.model, r.adapter, now)
	}
	b, _ := json.Marshal(schemas.Queued{Position: ahead + 1, WaitMS: wait.Milliseconds(), Band: r.band.String(),
		Dispatcher: d.cfg.ID, TimeoutMS: expires.Sub(now).Milliseconds(), RequestID: r.id, CancelToken: token,
		Cold: cold, BeatMS: d.cfg.HoldBeat.Milliseconds()})
	_ = d.nc.Publish(r.msg.Reply, schemas.AppendFrame(nil, schemas.FrameQueued, 0, b))
}

func (d *Dispatcher) unqueueLocked(e *queued) {
	if q := d.queues[e.model]; q != nil {
		q.Remove(&e.item)
	}
	delete(d.byID, e.id)
}

// drain forwards queued requests of models, and of the adapters whose base
// is among models, to workers that have room, each queue in its
// scheduler's order.
func (d *Dispatcher) drain(models []string) {
	type fwd struct {
		msg     *nats.Msg
		worker  string
		adapter *adapterRef
		span    trace.Span
		pred    prediction
		prefill string
	}
	var out []fwd
	now := time.Now()
	d.mu.Lock()
	if len(d.adapterQueues) > 0 {
		var more []string
		for _, m := range models {
			for a := range d.adapterQueues[m] {
				if !slices.Contains(models, a) && !slices.Contains(more, a) {
					more = append(more, a)
				}
			}
		}
		models = append(slices.Clip(models), more...)
	}
	for _, model := range models {
		q := d.queues[model]
		for q != nil && q.Len() > 0 && d.mayDispatchLocked(model, now) {
			e := q.Peek().Value.(*queued) // the next to go
			id, _, cached, ok := d.acquire(model, e.adapter, e.hashes, "")
			if !ok {
				break
			}
			q.Pop(now)
			delete(d.byID, e.id)
			d.chargedLocked(id, e.reqID, charge{model: e.model, tenant: e.item.Flow, band: e.item.Band, cost: e.item.Cost, at: now,
				expires: e.item.Expires})
			pw := d.choosePrefill(prompt{e.model, e.adapter, e.msg.Header, e.hashes, e.text}, cached, "")
			out = append(out, fwd{e.msg, id, e.adapter, e.span, d.predict(cached, e.hashes, e.text), pw})
			waited := now.Sub(e.enqueued()).Seconds()
			d.m.queueWait.Observe(waited)
			if e.cold {
				d.m.capacityWait.Observe(waited)
			}
			d.m.waited(e.item.Band, e.item.Flow, waited)
		}
	}
	d.mu.Unlock()
	for _, f := range out {
		d.forward(f.msg, f.worker, f.adapter, f.span, f.pred, f.prefill)
	}
}

// forward sends a request to a worker, keeping the client's reply subject.
// A request for an adapter carries its base and path; any other request has
// those headers removed (only the registry may name weights to load). The
// traceparent header is rewritten to the dispatch span, which ends here. A
// request routed by prefix carries the prediction of what the worker holds
// of its prompt (HdrPrefixCached); any other has that header removed. A
// disaggregated request carries its prefill worker (HdrPrefillWorker,
// disagg.go); any other has that header removed.
func (d *Dispatcher) forward(m *nats.Msg, worker string, ad *adapterRef, span trace.Span, pred prediction, prefill string) {
	m.Header.Set(schemas.HdrBounce, schemas.BounceSubject(d.cfg.ID))
	m.Header.Set(schemas.HdrWorker, worker)
	if prefill != "" {
		m.Header.Set(schemas.HdrPrefillWorker, prefill)
		if span != nil {
			span.SetAttributes(attribute.String(tracing.AttrPrefillWorker, prefill))
		}
	} else {
		m.Header.Del(schemas.HdrPrefillWorker)
	}
	pred.setHeader(m.Header)
	if ad != nil {
		m.Header.Set(schemas.HdrAdapterBase, ad.base)
		m.Header.Set(schemas.HdrAdapterPath, ad.path)
	} else {
		m.Header.Del(schemas.HdrAdapterBase)
		m.Header.Del(schemas.HdrAdapterPath)
	}
	if span != nil {
		tracing.InjectSpan(span, m.Header)
	}
	fwd := &nats.Msg{Subject: schemas.WorkSubject(worker), Reply: m.Reply, Header: m.Header, Data: m.Data}
	if d.cfg.Local != nil {
		fwd.Header = maps.Clone(m.Header) // the worker gets its own header map, as from the bus
	}
	if d.cfg.Local == nil || !d.cfg.Local.Take(worker, fwd) {
		if err := d.nc.PublishMsg(fwd); err != nil {
			d.fail(span, m.Reply, schemas.ErrForward.New(err))
			return
		}
	}
	d.m.routed.Inc()
	endSpan(span, worker, nil, "")
}

func (d *Dispatcher) reply(subject string, e *schemas.Error) {
	_ = d.nc.Publish(subject, schemas.AppendFrame(nil, schemas.FrameError, 0, e.Payload()))
}

// fail answers a request with e and ends its span with it.
func (d *Dispatcher) fail(span trace.Span, subject string, e *schemas.Error) {
	endSpan(span, "", e, "")
	d.reply(subject, e)
}

// sweep forgets silent workers and answers queued requests that waited too long
// or whose model lost its last worker.
func (d *Dispatcher) sweep(now time.Time) {
	if !d.nc.IsConnected() {
		// We hear no heartbeats while reconnecting: that is no worker's death
		// (with 250ms beats, a NATS restart would otherwise expire them all).
		d.fleet.Blind(now)
	}
	lost := d.fleet.Expire(now)
	for _, id := range lost {
		d.m.lost.Inc()
		d.log.Warn("worker lost: no heartbeat", "worker", id)
	}
	type rej struct {
		reply string
		err   *schemas.Error
		span  trace.Span
	}
	var out []rej
	d.mu.Lock()
	d.forgetChargesLocked(now, lost)
	var freed []string // models whose sharing with other dispatchers ended: what we held may go
	var limited map[string]int
	if len(d.coord.caps) > 0 {
		limited = maps.Clone(d.coord.caps)
	}
	d.recomputeLocked(now)
	for m := range limited {
		if _, ok := d.coord.caps[m]; !ok {
			freed = append(freed, m)
		}
	}
	for model, q := range d.queues {
		d.capacityLocked(model, q) // the fleet's slots, read once a sweep, not on every enqueue
	}
	d.announceLocked(now, false)
	for model, q := range d.queues {
		cold := d.coldQueueLocked(model, q)
		if head := q.Peek(); cold && d.holdable(model, head.Value.(*queued).adapter) {
			// Held from now on, whatever it queued as (behind busy workers,
			// or before this dispatcher's registry knew the model).
			d.goneColdLocked(q)
			d.heldLocked(model, head.Value.(*queued).adapter, now)
		}
		q.Expire(now, func(it *scheduler.Item) {
			e := it.Value.(*queued)
			delete(d.byID, e.id)
			d.m.refused(it.Band, it.Flow, "queue_timeout")
			err := schemas.ErrQueueTimeout.New("model `" + model + "`")
			if cold {
				err = schemas.ErrColdStartTimeout.New(model, now.Sub(e.enqueued()).Round(time.Second).String())
			}
			out = append(out, rej{e.msg.Reply, err, e.span})
		})
		if q.Len() > 0 && !d.warmingLocked(now) {
			// A model that lost its last worker: what waits for it is
			// answered now, unless it may wait for capacity (hold.go).
			// (One queue is one model or one adapter: its items share the
			// answer.)
			head := q.Peek().Value.(*queued)
			if d.serving(model, head.adapter) == 0 && !d.holdable(model, head.adapter) {
				var lost []*queued
				q.Items(func(it *scheduler.Item) { lost = append(lost, it.Value.(*queued)) })
				for _, e := range lost {
					d.unqueueLocked(e)
					out = append(out, rej{e.msg.Reply, d.noWorker(model, e.adapter), e.span})
				}
			}
		}
		if q.Len() == 0 {
			if d.fleet.Serving(model) == 0 && d.held[model] == nil {
				delete(d.queues, model) // its flows' state goes with its workers; the queue_depth series stays while the model is registered or served (modelStats)
			}
			for base, as := range d.adapterQueues {
				delete(as, model)
				if len(as) == 0 {
					delete(d.adapterQueues, base)
				}
			}
		}
	}
	beats := d.holdSweepLocked(now)
	d.mu.Unlock()
	for _, r := range out {
		d.m.rejected.WithLabelValues("queue_timeout").Inc()
		d.fail(r.span, r.reply, r.err)
	}
	d.sendBeats(beats)
	if len(freed) > 0 {
		d.drain(freed)
	}
	d.switchModels(now)
}

func (d *Dispatcher) rejectAll(e *schemas.Error) {
	d.mu.Lock()
	var replies []*queued
	for _, q := range d.queues {
		for q.Len() > 0 {
			replies = append(replies, q.Pop(time.Now()).Value.(*queued))
		}
	}
	d.queues = map[string]*scheduler.Queue{}
	d.byID = map[string]*queued{}
	d.adapterQueues = map[string]map[string]struct{}{}
	d.held = map[string]*holdState{}
	d.mu.Unlock()
	for _, r := range replies {
		d.fail(r.span, r.msg.Reply, e)
	}
}
