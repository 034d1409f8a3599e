// Package client is the Go client of tokenbus's NATS protocol. The gateway
// uses it, and so can any Go program that wants to skip HTTP: publish an
// OpenAI request body, read the reply stream frame by frame.
//
// One Client holds one wildcard subscription on its inbox prefix and routes
// replies to streams through a map: a subscription per stream would cost
// about 512 KB and several microseconds per token.
package client

import (
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// Options tune a Client. Zero values take the defaults shown.
type Options struct {
	// InboxPrefix is the subject prefix for reply subjects; default: the
	// connection's inbox prefix plus a unique token. Tenants restricted by NATS
	// permissions use the prefix they are allowed to subscribe to.
	InboxPrefix string
	// FirstFrameTimeout bounds the wait for the first frame (queued, accepted
	// or error) after publishing. Default 5s.
	FirstFrameTimeout time.Duration
	// StallTimeout bounds the silence between frames once a worker accepted
	// the request; workers send keepalives much more often. Default 15s.
	StallTimeout time.Duration
	// MaxPending bounds the frames buffered for one stream whose reader is
	// slower than its worker; past it the stream fails. Default 4096.
	MaxPending int
	// KeyID, when set, is the API key a NATS-native tenant sends with:
	// requests go on its tenant request subject
	// (schemas.TenantReqSubject), the only ones the tenant's NATS
	// permissions allow; replies must then come under its tenant's inbox
	// prefix (schemas.TenantInbox, which the connection sets with
	// nats.CustomInboxPrefix). Empty: the request subjects of trusted
	// publishers (the gateway).
	KeyID string
	// Submit, when set, takes requests instead of publishing them on their
	// request subject: an embedded dispatcher's Submit.
	Submit func(*nats.Msg) error
	// MigrationLimit is how many times one request may be sent again after
	// its worker failed (died, refused, went silent, or a gap): before its
	// first content chunk a retry, after it a migration (failover.go).
	// 0: the default, 3; negative: never (a failed worker fails its streams).
	MigrationLimit int
	// MigrationMaxSeqLen bounds the chunk frames a stream keeps so that it
	// can be continued elsewhere; a longer stream that loses its worker
	// fails with stream_lost. Default 4096.
	MigrationMaxSeqLen int
	// OnFailover, when set, is told of every retry, migration and failed
	// migration (for metrics). It runs on the stream's reader: keep it short.
	OnFailover func(Failover)
	Logger     *slog.Logger
}

func (o *Options) defaults() {
	if o.FirstFrameTimeout <= 0 {
		o.FirstFrameTimeout = 5 * time.Second
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 15 * time.Second
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 4096
	}
	if o.MigrationLimit == 0 {
		o.MigrationLimit = 3
	}
	if o.MigrationMaxSeqLen <= 0 {
		o.MigrationMaxSeqLen = 4096
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Client sends requests and demultiplexes their reply streams.
type Client struct {
	nc     *nats.Conn
	opts   Options
	prefix string // inbox prefix ending in '.'
	sub    *nats.Subscription

	mu      sync.Mutex
	streams map[string]*Stream // by inbox token

	later []entry // route's second pass; route runs on one goroutine
	// parts holds the pieces of frames sent in parts (schemas.FramePart),
	// by stream, until their last piece; only route's goroutine uses it.
	parts map[*Stream][]byte
}

// maxAssembled bounds one frame reassembled from parts.
const maxAssembled = 64 << 20

// entry is a frame of a multiplexed reply and its stream (nil: ended).
type entry struct {
	s     *Stream
	epoch uint32
	frame []byte
}

// New subscribes to the reply prefix on nc.
func New(nc *nats.Conn, opts Options) (*Client, error) {
	opts.defaults()
	prefix := opts.InboxPrefix
	if prefix == "" {
		// The connection's own prefix (nats.CustomInboxPrefix), which a
		// restricted tenant's permissions allow, else _INBOX.
		base := strings.TrimSuffix(nc.Opts.InboxPrefix, ".")
		if base == "" {
			base = strings.TrimSuffix(nats.InboxPrefix, ".")
		}
		prefix = base + "." + nuid.Next()
	}
	prefix = strings.TrimSuffix(prefix, ".") + "."
	c := &Client{nc: nc, opts: opts, prefix: prefix, streams: make(map[string]*Stream)}
	sub, err := nc.Subscribe(prefix+"*", c.route)
	if err != nil {
		return nil, err
	}
	// Replies for thousands of streams share this one subscription: let it
	// buffer generously rather than drop (a drop fails a stream).
	if err := sub.SetPendingLimits(1<<20, 256<<20); err != nil {
		return nil, err
	}
	// Replies must find the subscription at the server from the first
	// request on: a request may leave on another connection (an embedded
	// dispatcher's), and a worker answers it at once, so a SUB still in this
	// connection's write buffer would lose the first frames.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	c.sub = sub
	return c, nil
}

// Close unsubscribes; open streams fail.
func (c *Client) Close() error {
	err := c.sub.Unsubscribe()
	c.mu.Lock()
	streams := c.streams
	c.streams = nil // Start checks for nil: no stream can begin after Close
	c.mu.Unlock()
	for _, s := range streams {
		s.fail(schemas.ErrShuttingDown.New("tokenbus client"))
	}
	return err
}

// WorkerLost tells the client that worker id is gone (its heartbeats
// stopped, or NATS saw it disconnect): every stream that worker accepted
// and has not finished is retried or migrated now (failover.go), or, past
// its migration limit, ends with ErrWorkerLost, instead of waiting out its
// stall timeout.
func (c *Client) WorkerLost(id, why string) {
	for _, s := range c.streamsOf(id) {
		s.lose(schemas.ErrWorkerLost.New(id, why), ReasonWorkerLost)
	}
}

// streamsOf lists the open streams worker id accepted.
func (c *Client) streamsOf(id string) []*Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	var of []*Stream
	for _, s := range c.streams {
		if s.acceptedBy() == id {
			of = append(of, s)
		}
	}
	return of
}

// Open streams counts streams in flight.
func (c *Client) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams)
}

// Request is one request to send.
type Request struct {
	ID       string       // required; see schemas.ValidRequestID
	Kind     schemas.Kind // required
	Model    string       // required
	Body     []byte       // the OpenAI JSON body, sent as is; kept until the stream ends (a retry sends it again): do not modify it
	Deadline time.Time    // optional
	Priority int          // optional; orders the tenant's own queued requests: lower first
	Tenant   string       // optional
	Trace    string       // optional W3C traceparent
	// Flow control (docs/scheduling.md), all optional: the band (0: the
	// default, interactive), the tenant's weight in it (0: 1), the longest
	// wait in a dispatcher's queue (0: the dispatcher's queue timeout), and
	// max_tokens for the dispatcher's cost estimate (0: unknown).
	Band      schemas.Band
	Weight    int
	MaxQueue  time.Duration
	MaxTokens int
}

// Header builds the NATS headers of r.
func (r *Request) Header() nats.Header {
	h := nats.Header{}
	h[schemas.HdrRequestID] = []string{r.ID}
	h[schemas.HdrKind] = []string{string(r.Kind)}
	h[schemas.HdrModel] = []string{r.Model}
	if !r.Deadline.IsZero() {
		h[schemas.HdrDeadline] = []string{schemas.FormatDeadline(r.Deadline)}
	}
	if r.Priority != 0 {
		h[schemas.HdrPriority] = []string{strconv.Itoa(r.Priority)}
	}
	if r.Tenant != "" {
		h[schemas.HdrTenant] = []string{r.Tenant}
	}
	if r.Trace != "" {
		h[schemas.HdrTrace] = []string{r.Trace}
	}
	if r.Band.Valid() {
		h[schemas.HdrBand] = []string{r.Band.String()}
	}
	if r.Weight > 1 {
		h[schemas.HdrWeight] = []string{strconv.Itoa(r.Weight)}
	}
	if r.MaxQueue > 0 {
		h[schemas.HdrMaxQueue] = []string{strconv.FormatInt(r.MaxQueue.Milliseconds(), 10)}
	}
	if r.MaxTokens > 0 {
		h[schemas.HdrMaxTokens] = []string{strconv.Itoa(r.MaxTokens)}
	}
	h[schemas.HdrMux] = []string{"1"} // this client takes multiplexed replies
	return h
}

// ErrClosed is returned by Start after Close. It is a *schemas.Error (503,
// shutting_down) so that callers map it like every other bus error.
var ErrClosed error = schemas.ErrShuttingDown.New("tokenbus client")

// Start publishes r and returns its reply stream. The caller must Close the
// stream (which cancels the request if it has not finished).
func (c *Client) Start(r *Request) (*Stream, error) {
	if !schemas.ValidRequestID(r.ID) {
		return nil, schemas.ErrBadHeader.New(schemas.HdrRequestID)
	}
	if !r.Kind.Valid() {
		return nil, schemas.ErrUnknownKind.New(r.Kind)
	}
	// While the connection is down nats.go buffers publishes for the
	// reconnect: the request would wait out FirstFrameTimeout and fail with
	// a 503 that does not say why. Say it now.
	if !c.nc.IsConnected() {
		return nil, schemas.ErrBusUnavailable.New()
	}
	tok := nuid.Next()
	h := r.Header()
	// The token our cancels carry. A dispatcher that takes the request from
	// NATS sets its own (the queued or accepted frame hands it to us); one
	// embedded in our gateway (Submit) keeps this one.
	cancelToken := schemas.NewCancelToken()
	h[schemas.HdrCancelToken] = []string{cancelToken}
	s := newStream(c, tok, r.ID, cancelToken)
	s.req = *r
	if wantsTokenIDs(r, &c.opts) {
		h[schemas.HdrTokenIDs] = []string{"1"}
		s.fo.tokenIDs, s.fo.strip = true, true
	}
	c.mu.Lock()
	if c.streams == nil {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.streams[tok] = s
	c.mu.Unlock()
	subject := schemas.ReqSubject(r.Model)
	if c.opts.KeyID != "" {
		subject = schemas.TenantReqSubject(c.opts.KeyID, r.Model)
	}
	msg := &nats.Msg{Subject: subject, Reply: c.prefix + tok, Header: h, Data: r.Body}
	send := c.nc.PublishMsg
	if c.opts.Submit != nil {
		send = c.opts.Submit
	}
	if err := send(msg); err != nil {
		c.remove(tok)
		return nil, schemas.ErrPublish.New(err)
	}
	return s, nil
}

func (c *Client) remove(tok string) {
	c.mu.Lock()
	delete(c.streams, tok)
	c.mu.Unlock()
}

// route runs on the subscription's goroutine for every reply of every stream:
// keep it short and never block.
func (c *Client) route(m *nats.Msg) {
	tok := m.Subject[len(c.prefix):]
	if tok == schemas.MuxToken {
		// Frames of several streams in one message (see schemas.HdrMux).
		// Streams still waiting for their first chunk get theirs first: a
		// reader woken later waits behind every reader woken before it, and
		// time to first token is what a busy gateway must not trade.
		err := schemas.ForEachMuxEntry(m.Data, func(tok, frame []byte) {
			c.mu.Lock()
			s := c.streams[string(tok)] // no allocation for a map index
			var epoch uint32
			if s != nil {
				epoch = s.epoch
			}
			c.mu.Unlock()
			if s != nil && !s.begun.Load() {
				c.deliver(s, epoch, frame, false)
				return
			}
			c.later = append(c.later, entry{s, epoch, frame})
		})
		for i, e := range c.later {
			c.deliver(e.s, e.epoch, e.frame, false)
			c.later[i] = entry{}
		}
		c.later = c.later[:0]
		if err != nil {
			c.opts.Logger.Warn("dropping the rest of a malformed multiplexed reply", "subject", m.Subject)
		}
		return
	}
	c.mu.Lock()
	s := c.streams[tok]
	var epoch uint32
	if s != nil {
		epoch = s.epoch
	}
	c.mu.Unlock()
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		if s != nil {
			if e, lost := noResponders(m.Header.Get("Nats-Subject")); lost {
				s.lose(e, ReasonWorkerLost) // a retry on another worker may cure it
			} else {
				s.fail(e)
			}
		}
		return
	}
	c.deliver(s, epoch, m.Data, false)
}

// Prefix is the subject prefix of the client's reply subjects (ending in
// '.').
func (c *Client) Prefix() string { return c.prefix }

// Deliver takes a reply frame from a worker in this process, past the bus
// (see workers.LocalReplies): what route does with a message on the
// subject Prefix()+token. Frames of one stream must come in order from one
// goroutine at a time (a worker's call does that), never in parts. It keeps
// frame (the caller gives it up) and never blocks.
func (c *Client) Deliver(token string, frame []byte) {
	c.mu.Lock()
	s := c.streams[token] // nil after Close
	var epoch uint32
	if s != nil {
		epoch = s.epoch
	}
	c.mu.Unlock()
	c.deliver(s, epoch, frame, true)
}

// noResponders is the error for NATS's "no responders" answer to a message
// published to subject (its Nats-Subject header). The server sends it to the
// publisher's own connection: for a gateway with an embedded dispatcher that
// is the forward to a worker's work subject, which nobody holds when the
// worker has died and the fleet has not noticed yet: the worker is lost, not
// the dispatchers (what this said before, misleadingly).
func noResponders(subject string) (e *schemas.Error, workerLost bool) {
	if id, ok := strings.CutPrefix(subject, schemas.WorkPrefix); ok && id != "" {
		return schemas.ErrWorkerLost.New(id, "nobody takes its requests"), true
	}
	return schemas.ErrNoDispatcher.New(), false
}

// deliver hands one frame to its stream, s (nil: the stream has ended), for
// the attempt epoch that was current when s was looked up. local: from
// Deliver, on a worker's goroutine, which never sends parts (the parts being
// assembled are route's alone).
func (c *Client) deliver(s *Stream, epoch uint32, data []byte, local bool) {

	f, err := schemas.ParseFrame(data)
	if err != nil {
		c.opts.Logger.Warn("dropping malformed reply frame")
		return
	}
	if s == nil {
		// The stream ended (client gone) but a worker or a dispatcher's
		// queue still has it: tell them to drop it, with the token the
		// frame hands us.
		switch f.Type {
		case schemas.FrameAccepted:
			c.cancelLate(f.Payload)
		case schemas.FrameQueued:
			var q schemas.Queued
			if json.Unmarshal(f.Payload, &q) == nil && q.CancelToken != "" && q.RequestID != "" {
				_ = c.nc.Publish(schemas.QueueCancel, schemas.CancelBody(q.RequestID, q.CancelToken))
			}
		}
		return
	}
	if local && f.Type == schemas.FramePart {
		c.opts.Logger.Warn("dropping a reply frame part handed over in memory")
		return
	}
	if !local && (f.Type == schemas.FramePart || len(c.parts) > 0) {
		var ok bool
		if f, ok = c.assemble(s, epoch, f); !ok {
			return
		}
	}
	s.push(f, epoch)
}

// assemble collects the pieces of a frame sent in parts. A part is pushed
// as a keepalive with its sequence number (the numbering stays checked, and
// the stall timer sees the worker is alive); the frame after the parts gets
// their payloads in front of its own. ok is false when f was consumed.
func (c *Client) assemble(s *Stream, epoch uint32, f schemas.Frame) (schemas.Frame, bool) {
	if f.Type == schemas.FramePart {
		if c.parts == nil {
			c.parts = map[*Stream][]byte{}
		}
		if _, ok := c.parts[s]; !ok {
			c.forgetEndedParts() // a stream that failed mid-frame left its pieces
		}
		b := append(c.parts[s], f.Payload...)
		if len(b) > maxAssembled {
			delete(c.parts, s)
			s.fail(schemas.ErrStreamOverflow.New())
			return f, false
		}
		c.parts[s] = b
		s.push(schemas.Frame{Type: schemas.FrameKeepalive, Seq: f.Seq}, epoch)
		return f, false
	}
	if b, ok := c.parts[s]; ok {
		delete(c.parts, s)
		f.Payload = append(b, f.Payload...)
	}
	return f, true
}

// forgetEndedParts drops the pieces of streams that are no longer open.
func (c *Client) forgetEndedParts() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.parts {
		if c.streams[s.tok] != s {
			delete(c.parts, s)
		}
	}
}

func (c *Client) cancelLate(payload []byte) {
	acc, ok := schemas.ParseAccepted(payload)
	if !ok || acc.Cancel == "" || acc.RequestID == "" {
		return
	}
	_ = c.nc.Publish(acc.Cancel, schemas.CancelBody(acc.RequestID, acc.CancelToken))
}
