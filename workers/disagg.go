package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Prefill/decode disaggregation (docs/disaggregation.md), the worker's
// part. A dispatcher that disaggregates a request forwards it to a decode
// worker with the id of a prefill worker (schemas.HdrPrefillWorker). The
// decode worker, which owns the client's stream as for any request, sends
// that worker the prefill, as vLLM's disaggregated-serving proxy does (and
// llm-d's routing sidecar, which also sits beside the decode instance):
// the request with PrefillBody's changes (kv_transfer_params
// do_remote_decode, stream false, max_tokens 1), over NATS to the prefill
// worker's prefill subject (schemas.PrefillSubject: workers may publish
// there, never to another worker's work subject). The answer's
// kv_transfer_params go, untouched, with the original request to its own
// engine, which takes the KV blocks from the prefill engine instead of
// prefilling.
//
// Nothing here can lose the request: a prefill that fails, is refused (the
// prefill worker is full: no bounce, it answers at once), or goes silent
// (the worker died: no frame for two keepalive intervals) leaves the
// request to run whole on the decode worker; so does an answer without
// params (an engine without a KV connector), and a decode engine refusing
// the params (they expired, the prefill engine restarted) before its first
// chunk. A client that hangs up during the prefill cancels it there.

// Outcomes of a remote prefill (tokenbus_worker_remote_prefills_total).
const (
	prefillOK          = "ok"          // the decode ran on the transferred KV cache
	prefillFailed      = "failed"      // the prefill worker answered an error (full, unhealthy...): run whole
	prefillLost        = "lost"        // no answer (the prefill worker is gone or silent): run whole
	prefillNoParams    = "no_params"   // its answer had no kv_transfer_params: run whole
	prefillRefused     = "refused"     // the decode engine could not take the KV blocks: run again whole
	prefillCancelled   = "cancelled"   // the client went away during the prefill
	prefillUnsupported = "unsupported" // this worker's engine has no KV transfer: run whole
)

var prefillOutcomes = []string{prefillOK, prefillFailed, prefillLost, prefillNoParams, prefillRefused, prefillCancelled, prefillUnsupported}

// disaggMetrics are a worker's disaggregation metrics.
type disaggMetrics struct {
	remote   *prometheus.CounterVec // decode side: remote prefills by outcome
	prefill  prometheus.Histogram   // decode side: asking for the prefill to having its params
	transfer prometheus.Histogram   // decode side: engine start to first chunk on transferred KV
	served   *prometheus.CounterVec // prefill side: prefills run for another worker, by outcome
}

func newDisaggMetrics() disaggMetrics {
	m := disaggMetrics{
		remote: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_worker_remote_prefills_total",
			Help: "Disaggregated requests this worker decoded, by how their remote prefill went: ok, failed, lost, no_params, refused (each of these ran whole here), cancelled, unsupported."},
			[]string{"outcome"}),
		prefill: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_worker_remote_prefill_seconds", Help: "From sending a disaggregated request's prefill to a prefill worker to having its KV-transfer params.",
			Buckets: ttftBuckets}),
		transfer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tokenbus_worker_kv_transfer_seconds", Help: "For requests prefilled elsewhere: from the engine call to its first chunk, the KV transfer and the first decode step.",
			Buckets: ttftBuckets}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenbus_worker_prefills_served_total", Help: "Prefills this worker ran for another worker's disaggregated request, by outcome (ok, error, cancelled)."},
			[]string{"outcome"}),
	}
	for _, o := range prefillOutcomes {
		m.remote.WithLabelValues(o)
	}
	for _, o := range []string{"ok", "error", "cancelled"} {
		m.served.WithLabelValues(o)
	}
	return m
}

func (m disaggMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.remote, m.prefill, m.transfer, m.served}
}

// kvTransfer reports whether the engine speaks vLLM's KV-transfer handshake.
func kvTransfer(eng engine.Engine) bool {
	kt, ok := eng.(engine.KVTransferer)
	return ok && kt.KVTransfer()
}

// remote is a call's remote prefill, set once its params are in the body.
type remote struct {
	worker  string
	whole   engine.Request // the request as it came, to run whole if the decode refuses the params
	genAt   time.Time      // when the engine was called with the params
	span    trace.Span     // the "prefill" span, ended at the first chunk or the fallback
	counted bool           // its first chunk was observed
}

// readDisagg reads c's disaggregation headers and keeps kv_transfer_params
// only on a prefill another worker sent: a client's are removed, so nobody
// can point an engine at KV blocks, or make it hold them, at will.
func (c *call) readDisagg(h nats.Header, prefill bool) *schemas.Error {
	c.prefillWorker = h.Get(schemas.HdrPrefillWorker)
	c.prefillFor = prefill
	if c.prefillFor || !schemas.ValidToken(c.prefillWorker) {
		// A prefill is not disaggregated again; a name that is no subject
		// token (a dispatcher never sends one) is no worker to publish to.
		c.prefillWorker = ""
	}
	if c.req.View == nil || c.req.View.KVTransfer == nil || c.prefillFor {
		return nil
	}
	body, ok := schemas.WithoutTransferParams(c.req.Body)
	if !ok {
		return schemas.ErrBadHeader.New("kv_transfer_params")
	}
	view, err := schemas.ReadRequestFor(c.req.Kind, body, c.req.Model)
	if err != nil {
		return err
	}
	c.req.Body, c.req.View = body, view
	return nil
}

// prefillRemote runs c's prefill on its prefill worker and, with the
// answer's params, makes c the decode request. On any failure c is left as
// it was: it runs whole here.
func (w *Worker) prefillRemote(c *call) {
	pw := c.prefillWorker
	if pw == "" || pw == w.cfg.ID || c.req.View == nil {
		return
	}
	if !w.kvTransfer {
		w.m.disagg.remote.WithLabelValues(prefillUnsupported).Inc()
		return
	}
	start := time.Now()
	ctx, span := tracer.Start(c.ctx, "prefill", trace.SpanKindProducer)
	if span.IsRecording() {
		span.SetName("prefill " + c.req.Model)
		span.SetAttributes(attribute.String(tracing.AttrPrefillWorker, pw), attribute.String(tracing.AttrRequestID, c.req.ID))
	}
	params, err := w.askPrefill(ctx, c, pw, span)
	var body []byte
	var view *schemas.Request
	outcome := prefillOK
	switch {
	case err != nil && c.ctx.Err() != nil:
		outcome = prefillCancelled
	case errors.Is(err, errPrefillLost):
		outcome = prefillLost
	case err != nil:
		outcome = prefillFailed
	case params == nil:
		outcome, err = prefillNoParams, schemas.ErrPrefillFailed.New(pw, "its answer had no kv_transfer_params")
	default:
		var ok bool
		if body, ok = schemas.DecodeBody(c.req.Body, params); ok {
			view, err = asError(schemas.ReadRequestFor(c.req.Kind, body, c.req.Model))
		} else {
			err = schemas.ErrPrefillFailed.New(pw, "the request body could not take the params")
		}
		if err != nil {
			outcome = prefillFailed
		}
	}
	if outcome != prefillOK {
		w.m.disagg.remote.WithLabelValues(outcome).Inc()
		span.SetAttributes(attribute.String(tracing.AttrPrefillOutcome, outcome))
		tracing.Fail(span, err)
		span.End()
		if outcome != prefillCancelled {
			w.log.Warn("remote prefill failed; running the request whole", "request_id", c.req.ID, "prefill_worker", pw,
				"outcome", outcome, "err", err)
		}
		return
	}
	w.m.disagg.prefill.Observe(time.Since(start).Seconds())
	span.SetAttributes(attribute.String(tracing.AttrPrefillEngine, schemas.TransferParamString(params, "remote_engine_id")))
	c.remote = &remote{worker: pw, whole: c.req, span: span, genAt: time.Now()}
	c.req.Body, c.req.View = body, view
}

// asError turns ReadRequestFor's typed nil into a plain nil error.
func asError(v *schemas.Request, e *schemas.Error) (*schemas.Request, error) {
	if e != nil {
		return nil, e
	}
	return v, nil
}

// remoteFirstChunk notes c's first chunk on transferred KV (Chunks), or,
// with chunk false, the end of a request without chunks (not streamed):
// then there is no first-chunk time to observe.
func (c *call) remoteFirstChunk(chunk bool) {
	r := c.remote
	if r == nil || r.counted {
		return
	}
	r.counted = true
	if chunk {
		c.w.m.disagg.transfer.Observe(time.Since(r.genAt).Seconds())
	}
	c.w.m.disagg.remote.WithLabelValues(prefillOK).Inc()
	r.span.SetAttributes(attribute.String(tracing.AttrPrefillOutcome, prefillOK))
	r.span.End()
}

// decodeRefused handles a decode engine's error: when it refused the
// transferred KV before the first chunk, c becomes its whole request again
// and true is returned (run it again).
func (w *Worker) decodeRefused(c *call, err error) bool {
	r := c.remote
	if r == nil || r.counted || c.firstChunk || c.ctx.Err() != nil || !schemas.ErrKVTransferFailed.Is(schemas.AsError(err)) {
		return false
	}
	r.counted = true
	w.m.disagg.remote.WithLabelValues(prefillRefused).Inc()
	r.span.SetAttributes(attribute.String(tracing.AttrPrefillOutcome, prefillRefused))
	tracing.Fail(r.span, err)
	r.span.End()
	w.log.Warn("decode engine refused the transferred KV cache; running the request whole", "request_id", c.req.ID,
		"prefill_worker", r.worker, "err", err)
	c.req = r.whole
	c.remote = nil
	return true
}

// errPrefillLost: the prefill worker did not answer.
var errPrefillLost = errors.New("prefill worker lost")

// askPrefill sends c's prefill to worker pw and waits for its answer's
// kv_transfer_params (nil when it had none).
func (w *Worker) askPrefill(ctx context.Context, c *call, pw string, span trace.Span) ([]byte, error) {
	body, ok := schemas.PrefillBody(c.req.Body)
	if !ok {
		return nil, schemas.ErrPrefillFailed.New(pw, "the request body is not an object")
	}
	inbox, frames, err := w.prefills.open()
	if err != nil {
		return nil, schemas.ErrPrefillFailed.New(pw, err.Error())
	}
	defer w.prefills.close(inbox)
	token := schemas.NewCancelToken()
	h := nats.Header{}
	h.Set(schemas.HdrRequestID, c.req.ID)
	h.Set(schemas.HdrKind, string(c.req.Kind))
	h.Set(schemas.HdrModel, c.req.Model)
	h.Set(schemas.HdrCancelToken, token)
	if !c.req.Deadline.IsZero() {
		h.Set(schemas.HdrDeadline, schemas.FormatDeadline(c.req.Deadline))
	}
	if c.req.Band != 0 {
		h.Set(schemas.HdrBand, c.req.Band.String())
	}
	tracing.InjectSpan(span, h)
	if err := w.nc.PublishMsg(&nats.Msg{Subject: schemas.PrefillSubject(pw), Reply: inbox, Header: h, Data: body}); err != nil {
		return nil, schemas.ErrPrefillFailed.New(pw, err.Error())
	}
	cancel := func() { _ = w.nc.Publish(schemas.PrefillCancelSubject(pw), schemas.CancelBody(c.req.ID, token)) }
	// A live prefill worker answers at once (accepted), then sends a
	// keepalive every prefillKeepalive of silence: four of silence and it
	// is gone (killed, partitioned), and the request runs whole here.
	silence := prefillSilence
	var parts []byte
	quiet := time.NewTimer(silence)
	defer quiet.Stop()
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		case <-quiet.C:
			cancel()
			return nil, fmt.Errorf("%w: %s: no answer in %s", errPrefillLost, pw, silence)
		case m = <-frames:
			quiet.Reset(silence)
		}
		switch {
		case len(m.Data) == 0 && m.Header.Get("Status") == "503": // NATS: nobody subscribes to its prefill subject
			return nil, fmt.Errorf("%w: %s: no such worker", errPrefillLost, pw)
		}
		f, ferr := schemas.ParseFrame(m.Data)
		if ferr != nil {
			cancel()
			return nil, schemas.ErrPrefillFailed.New(pw, ferr.Error())
		}
		switch f.Type {
		case schemas.FramePart:
			if len(parts)+len(f.Payload) > maxPrefillAnswer {
				cancel()
				return nil, schemas.ErrPrefillFailed.New(pw, "its answer is too large")
			}
			parts = append(parts, f.Payload...)
		case schemas.FrameDone:
			answer := append(parts, f.Payload...)
			if p := schemas.TransferParamsOf(answer); p != nil {
				return append([]byte(nil), p...), nil
			}
			return nil, nil
		case schemas.FrameError:
			e := schemas.ParseErrorPayload(f.Payload)
			return nil, schemas.ErrPrefillFailed.New(pw, e.Body.Message)
		}
	}
}

// prefillReplies takes the answers to a worker's remote prefills on one
// wildcard subscription (its inbox prefix + ".*"), not one subscription per
// prefill: no subscribe and unsubscribe on the way to each first token.
type prefillReplies struct {
	nc     *nats.Conn
	mu     sync.Mutex
	prefix string                    // "<inbox>." once subscribed
	sub    *nats.Subscription        // nil until the first prefill
	open_  map[string]chan *nats.Msg // by reply subject
}

// open returns a new reply subject and the channel its frames arrive on.
func (r *prefillReplies) open() (string, <-chan *nats.Msg, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub == nil {
		prefix := r.nc.NewRespInbox() + "."
		sub, err := r.nc.Subscribe(prefix+"*", r.deliver)
		if err != nil {
			return "", nil, err
		}
		_ = sub.SetPendingLimits(1<<20, 1<<30)
		r.sub, r.prefix, r.open_ = sub, prefix, map[string]chan *nats.Msg{}
	}
	subject := r.prefix + nuid.Next()
	ch := make(chan *nats.Msg, prefillFrames)
	r.open_[subject] = ch
	return subject, ch, nil
}

// close forgets a reply subject: frames still coming to it are dropped.
func (r *prefillReplies) close(subject string) {
	r.mu.Lock()
	delete(r.open_, subject)
	r.mu.Unlock()
}

// deliver hands a frame to its prefill. A prefill sends a few frames
// (accepted, keepalives, parts, done) and its reader takes each at once;
// one that overflows the channel is dropped, and the prefill then ends in
// silence (lost: the request runs whole), never blocking the others.
func (r *prefillReplies) deliver(m *nats.Msg) {
	r.mu.Lock()
	ch := r.open_[m.Subject]
	r.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- m:
	default:
	}
}

// prefillFrames bounds the frames waiting for one prefill's reader.
const prefillFrames = 64

// prefillKeepalive is how often a prefill run for another worker gets a
// keepalive while it is silent, and prefillSilence how long its decode
// worker waits for a frame before it takes the prefill worker for dead:
// short, since the request's first token waits on it.
const (
	prefillKeepalive = 250 * time.Millisecond
	prefillSilence   = 4 * prefillKeepalive
)

// maxPrefillAnswer bounds a prefill answer (one token and the params).
const maxPrefillAnswer = 4 << 20

// servedOutcome labels a failed prefill run for another worker.
func servedOutcome(err error) string {
	if errors.Is(err, context.Canceled) {
		return "cancelled"
	}
	return "error"
}
