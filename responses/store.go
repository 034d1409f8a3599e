package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/schemas"
)

// The JetStream names responses are kept under.
const (
	Bucket      = "TOKENBUS_RESPONSES"       // Key-Value: one Record per stored response
	EventStream = "TOKENBUS_RESPONSE_EVENTS" // the events of background responses
	WorkStream  = "TOKENBUS_RESPONSE_WORK"   // work queue: background responses to run
	IndexStream = "TOKENBUS_RESPONSE_INDEX"  // one message per stored response, on its tenant's subject
	// EventPrefix + <response-id>: its events, one message each, in order.
	EventPrefix = schemas.Prefix + ".responses.events."
	// WorkPrefix + <tenant-token>.<kind>: a background response (kind bg)
	// or resumable chat stream (chat) of the tenant to run; the message is
	// its id. (Before issue 32: WorkPrefix + <response-id>, one queue for
	// all tenants.)
	WorkPrefix = schemas.Prefix + ".responses.work."
	// IndexPrefix + <tenant-token>: one message per stored response of the
	// tenant, so that counting them is one subject's count.
	IndexPrefix = schemas.Prefix + ".responses.index."
)

// Config tunes a Store. Zero values take the defaults shown.
type Config struct {
	Replicas  int           // default 1
	Retention time.Duration // how long responses and their events are kept; default 30 days (OpenAI's)
	// RecordBytes and EventBytes bound the bucket of records and the
	// stream of events (JetStream's MaxBytes; full, new ones are refused
	// with 503, nothing stored is dropped). Default 512 MiB each.
	RecordBytes, EventBytes int64
	// MaxFollows bounds the follows (streamed background responses,
	// resumable streams) this store serves at once, each one JetStream
	// consumer (default 1024); MaxFollowsPerTenant those of one tenant
	// (default 256).
	MaxFollows, MaxFollowsPerTenant int
	// Quota, if set, is a tenant's quota (see Quota); nil: none. An error
	// refuses the request (a *schemas.Error keeps its status).
	Quota func(ctx context.Context, tenant string) (Quota, error)
}

// The limits of the streams Open makes (docs/responses.md says why).
const (
	// Consumers on the events stream: the follows of every gateway (each
	// bounded by MaxFollows; runners and cancels read with gets). Set
	// explicitly: nats-server's default (1,000 per stream, shared by all
	// tenants) is what issue 32 exhausted.
	eventConsumers = 4096
	// Consumers on the work queue: one per tenant with work queued or
	// running (deleted once idle), and the legacy "runners".
	workConsumers = 10_000
	workMsgs      = 200_000
	workBytes     = 64 << 20
	// workPerSubject is the server's own ceiling on one tenant's queued or
	// running work of one kind, whatever Quota says.
	workPerSubject = 10_000
	indexBytes     = 64 << 20
)

// Store keeps responses in JetStream, shared by every gateway.
type Store struct {
	cfg    Config
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	kvs    jetstream.Stream // the bucket's stream: purges that need no room
	events jetstream.Stream
	work   jetstream.Stream
	index  jetstream.Stream
	follow *followers
	// queued hears of work this store queued, for a runner in the same
	// process to take it at once (others find it by polling).
	queued chan string
}

// Record is a stored response: OpenAI's object and what tokenbus needs.
type Record struct {
	Response Response `json:"response"`
	Tenant   string   `json:"tenant"`
	KeyID    string   `json:"key_id,omitempty"`
	Input    []Item   `json:"input"`             // this response's input items
	History  []Item   `json:"history,omitempty"` // the conversation before it (previous_response_id)
	Body     []byte   `json:"body,omitempty"`    // the chat request of a background response
	// Kind is "" for a response, KindChat for a resumable chat stream
	// (whose Response holds only its id, model, status and creation time).
	Kind string `json:"kind,omitempty"`
	// Reserved and Window: what admission reserved against the key's TPM
	// (settled with the usage the runner records).
	Reserved int   `json:"reserved,omitempty"`
	Window   int64 `json:"window,omitempty"`
	// Index is the stream sequence of its message in IndexStream (0:
	// none, a record from before quotas).
	Index uint64 `json:"index,omitempty"`
	// Deadline (Unix ms) of a resumable chat stream: the gateway's
	// request timeout from its start, whichever runner runs it.
	Deadline int64 `json:"deadline,omitempty"`
}

// Conversation is what a response continuing this one is preceded by.
func (r *Record) Conversation() []Item {
	out := make([]Item, 0, len(r.History)+len(r.Input)+len(r.Response.Output))
	out = append(out, r.History...)
	out = append(out, r.Input...)
	return append(out, r.Response.Output...)
}

// New is the response object of req, in progress: it echoes what the
// request set, and the defaults of what it did not.
func New(id string, req *CreateRequest, created time.Time) *Response {
	r := &Response{ID: id, Object: "response", CreatedAt: created.Unix(), Status: StatusInProgress,
		Background: req.Background, Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens,
		MaxToolCalls: req.MaxToolCalls, Model: req.Model, Output: []Item{},
		ParallelToolCalls:  req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		PreviousResponseID: req.PreviousResponseID, PromptCacheKey: req.PromptCacheKey, Reasoning: req.Reasoning,
		SafetyIdentifier: req.SafetyIdentifier, ServiceTier: "default", Store: req.Stored(), Temperature: req.Temperature,
		Text: echoText(req.Text), ToolChoice: json.RawMessage(`"auto"`), Tools: req.Tools, TopLogprobs: req.TopLogprobs,
		TopP: req.TopP, Truncation: TruncationDisabled, Metadata: req.Metadata}
	if len(req.ToolChoice) > 0 && string(req.ToolChoice) != "null" {
		r.ToolChoice = req.ToolChoice
	}
	if req.Truncates() {
		r.Truncation = TruncationAuto
	}
	if req.ServiceTier != nil && *req.ServiceTier == "flex" {
		r.ServiceTier = "flex"
	}
	if r.Tools == nil {
		r.Tools = []json.RawMessage{}
	}
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	if req.Background {
		r.Status = StatusQueued
	}
	if req.User != "" {
		r.User = &req.User
	}
	return r
}

// echoText is the response's text: the format as sent (text when none),
// and the verbosity (medium, the only one served).
func echoText(t *TextConfig) json.RawMessage {
	out := TextConfig{Format: json.RawMessage(`{"type":"text"}`), Verbosity: ptr("medium")}
	if t != nil && len(t.Format) > 0 && string(t.Format) != "null" {
		out.Format = t.Format
	}
	b, _ := json.Marshal(out)
	return b
}

// Open makes (or finds) the bucket and streams, with the limits above.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.RecordBytes <= 0 {
		cfg.RecordBytes = 512 << 20
	}
	if cfg.EventBytes <= 0 {
		cfg.EventBytes = 512 << 20
	}
	if cfg.MaxFollows <= 0 {
		cfg.MaxFollows = 1024
	}
	if cfg.MaxFollowsPerTenant <= 0 {
		cfg.MaxFollowsPerTenant = 256
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, js: js, follow: newFollowers(cfg.MaxFollows, cfg.MaxFollowsPerTenant), queued: make(chan string, 256)}
	if s.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "tokenbus responses: one record per stored response", Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, History: 1, TTL: cfg.Retention, MaxBytes: cfg.RecordBytes}); err != nil {
		return nil, fmt.Errorf("responses bucket: %w", err)
	}
	if s.kvs, err = js.Stream(ctx, "KV_"+Bucket); err != nil {
		return nil, fmt.Errorf("responses bucket: %w", err)
	}
	// Discard new everywhere: a full stream refuses what comes, it never
	// drops what another tenant stored.
	if s.events, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: EventStream,
		Description: "tokenbus background responses' events, for streams resumed on any gateway",
		Subjects:    []string{EventPrefix + "*"}, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		MaxAge: cfg.Retention, MaxBytes: cfg.EventBytes, Discard: jetstream.DiscardNew,
		MaxConsumers: eventConsumers}); err != nil {
		return nil, fmt.Errorf("response events stream: %w", err)
	}
	if s.work, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: WorkStream,
		Description: "tokenbus background responses and resumable streams to run, one subject per tenant and kind",
		Subjects:    []string{WorkPrefix + "*.*", WorkPrefix + "*"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: cfg.Replicas, Duplicates: 2 * time.Minute,
		MaxMsgs: workMsgs, MaxBytes: workBytes, MaxMsgsPerSubject: workPerSubject,
		Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, MaxConsumers: workConsumers}); err != nil {
		return nil, fmt.Errorf("response work stream: %w", err)
	}
	if s.index, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: IndexStream,
		Description: "tokenbus stored responses, one message each on its tenant's subject (their count is the quota's)",
		Subjects:    []string{IndexPrefix + "*"}, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		MaxAge: cfg.Retention, MaxBytes: indexBytes, Discard: jetstream.DiscardNew, MaxConsumers: 1}); err != nil {
		return nil, fmt.Errorf("response index stream: %w", err)
	}
	return s, nil
}

func unavailable(err error) error {
	var e *schemas.Error
	if errors.As(err, &e) {
		return e
	}
	return schemas.ErrResponsesOff.New(err)
}

// Put stores rec (a new response, or one replacing it).
func (s *Store) Put(ctx context.Context, rec *Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, rec.Response.ID, b); err != nil {
		return unavailable(err)
	}
	return nil
}

// Get reads a response of tenant; another tenant's is not found.
func (s *Store) Get(ctx context.Context, tenant, id string) (*Record, uint64, error) {
	rec, rev, err := s.get(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	if rec.Tenant != tenant || rec.Kind != "" {
		return nil, 0, schemas.ErrResponseNotFound.New(id)
	}
	if rec.Response.Background && !Ended(rec.Response.Status) {
		s.settle(ctx, rec)
	}
	return rec, rev, nil
}

// settle gives a background response still running in its record the end
// state of its last event, if that event ended it: the runner appends the
// terminal event first and sets the record right after, and a client that
// has seen the event must not read the earlier state.
func (s *Store) settle(ctx context.Context, rec *Record) {
	last, err := s.events.GetLastMsgForSubject(ctx, EventPrefix+rec.Response.ID)
	if err != nil {
		return // none yet, or JetStream cannot say: the record stands
	}
	var ev Event
	if json.Unmarshal(last.Data, &ev) == nil && ev.Response != nil && Ended(ev.Response.Status) {
		rec.Response = *ev.Response
	}
}

func (s *Store) get(ctx context.Context, id string) (*Record, uint64, error) {
	if !validID(id) {
		return nil, 0, schemas.ErrResponseNotFound.New(id)
	}
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, schemas.ErrResponseNotFound.New(id)
	}
	if err != nil {
		return nil, 0, unavailable(err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, schemas.ErrInternal.New("a stored response is not JSON")
	}
	return &rec, e.Revision(), nil
}

// update replaces a record read at rev; a changed one is an error.
func (s *Store) update(ctx context.Context, rec *Record, rev uint64) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	return s.kv.Update(ctx, rec.Response.ID, b, rev)
}

// validID: a response id is one subject token, resp_ and letters or digits.
// (A resumable chat stream's id is cs_ and letters or digits.)
func validID(id string) bool {
	rest, ok := strings.CutPrefix(id, "resp_")
	if !ok {
		rest, ok = strings.CutPrefix(id, ChatStreamPrefix)
	}
	if !ok || rest == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// purge removes id's record, leaving no marker: KV's Delete and Purge
// write one, which a full stream refuses.
func (s *Store) purge(ctx context.Context, id string) error {
	return s.kvs.Purge(ctx, jetstream.WithPurgeSubject("$KV."+Bucket+"."+id))
}

// Delete removes a response of tenant, its events and its place in the
// tenant's count. None of it needs room in JetStream: a full store can
// still be emptied.
func (s *Store) Delete(ctx context.Context, tenant, id string) error {
	rec, _, err := s.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	if err := s.purge(ctx, id); err != nil {
		return unavailable(err)
	}
	if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(EventPrefix+id)); err != nil {
		return unavailable(err)
	}
	s.unreserve(ctx, rec)
	return nil
}

// errConflict: another writer appended to a response's events first.
var errConflict = errors.New("responses: another writer appended first")

// append publishes ev as the event after the stream message last (0: the
// first); a concurrent writer makes it fail with errConflict, so that the
// events of a response have one order and no repeat whoever writes them.
func (s *Store) append(ctx context.Context, id string, ev *Event, last uint64) (uint64, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	return s.appendRaw(ctx, id, b, ev.SequenceNumber, last)
}

// appendRaw is append of data, event number n (for de-duplication).
func (s *Store) appendRaw(ctx context.Context, id string, data []byte, n int, last uint64) (uint64, error) {
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: EventPrefix + id, Data: data,
		Header: nats.Header{jetstream.MsgIDHeader: []string{id + "/" + strconv.Itoa(n)}}},
		jetstream.WithExpectLastSequencePerSubject(last))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, errConflict
		}
		return 0, err
	}
	if ack.Duplicate {
		return 0, errConflict
	}
	return ack.Sequence, nil
}

// latest is the stream sequence of id's last event, and the event (0 and
// nil: none).
func (s *Store) latest(ctx context.Context, id string) (uint64, *Event, error) {
	m, err := s.events.GetLastMsgForSubject(ctx, EventPrefix+id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	var ev Event
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return 0, nil, err
	}
	return m.Sequence, &ev, nil
}

// lastEvent is the stream sequence of id's last event (0: none).
func (s *Store) lastEvent(ctx context.Context, id string) (uint64, error) {
	last, err := s.events.GetLastMsgForSubject(ctx, EventPrefix+id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return last.Sequence, nil
}

// stored calls fn with each stored message of id's events up to stream
// sequence last, in order, read one at a time (a get of the next message
// on the subject): no consumer, so that runners and cancels work however
// many consumers followers hold, and leave none behind.
func (s *Store) stored(ctx context.Context, id string, last uint64, fn func(seq uint64, data []byte)) error {
	subj := EventPrefix + id
	for seq := uint64(1); seq <= last; {
		m, err := s.events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // purged meanwhile (deleted)
		}
		if err != nil {
			return err
		}
		if m.Sequence > last {
			return nil
		}
		fn(m.Sequence, m.Data)
		seq = m.Sequence + 1
	}
	return nil
}

// replay reads the events stored for id into gen; it returns the stream
// sequence of the last one (0: none).
func (s *Store) replay(ctx context.Context, id string, gen *Gen) (uint64, error) {
	last, err := s.lastEvent(ctx, id)
	if err != nil || last == 0 {
		return 0, err
	}
	err = s.stored(ctx, id, last, func(_ uint64, data []byte) {
		var ev Event
		if json.Unmarshal(data, &ev) == nil {
			gen.Replay(&ev)
		}
	})
	return last, err
}

// Cancel ends a background response of tenant as cancelled: its record,
// then a response.cancelled event, appended after the last one so that a
// runner still generating it fails its next append and stops.
func (s *Store) Cancel(ctx context.Context, tenant, id string) (*Response, error) {
	for range 10 {
		rec, rev, err := s.Get(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		if !rec.Response.Background {
			return nil, schemas.ErrResponseState.New("Cannot cancel a synchronous response.")
		}
		if Ended(rec.Response.Status) {
			if rec.Response.Status == StatusCancelled {
				return &rec.Response, nil
			}
			return nil, schemas.ErrResponseState.New("Cannot cancel a response with status '" + rec.Response.Status + "'.")
		}
		gen := NewGen(&rec.Response, nil)
		last, err := s.replay(ctx, id, gen)
		if err != nil {
			return nil, unavailable(err)
		}
		r := rec.Response
		r.Status = StatusCancelled
		if r.Output == nil {
			r.Output = []Item{}
		}
		rec.Response = r
		rev, err = s.update(ctx, rec, rev)
		if err != nil {
			continue // changed meanwhile: read again
		}
		ev := Event{Type: "response.cancelled", SequenceNumber: gen.Seq(), Response: &r}
		_, err = s.append(ctx, id, &ev, last)
		// A runner still generating appends meanwhile, an event a token: the
		// cancel goes after its latest event, as often as that takes (once
		// was not enough: a second conflict left the runner generating to
		// the end while the record said cancelled), unless that event ended
		// the response.
		for try := 0; errors.Is(err, errConflict) && try < 100; try++ {
			var latest *Event
			if last, latest, err = s.latest(ctx, id); err != nil || latest == nil {
				break
			}
			if !latest.Terminal() {
				ev.SequenceNumber = latest.SequenceNumber + 1
				_, err = s.append(ctx, id, &ev, last)
				continue
			}
			if latest.Type == ev.Type {
				break // cancelled by another caller meanwhile
			}
			// The cancel came too late: the record follows the events again
			// (the runner, finding it cancelled, leaves it), and the caller
			// is told, as for a response that had ended before.
			if last, err = s.replay(ctx, id, gen); err == nil && gen.Ended() {
				rec.Response = *gen.Resp
				for range 10 {
					if _, err := s.update(ctx, rec, rev); err == nil {
						break
					}
					cur, curRev, err := s.get(ctx, id)
					if err != nil {
						break
					}
					rev = curRev
					rec.Body = cur.Body
				}
				return nil, schemas.ErrResponseState.New("Cannot cancel a response with status '" + gen.Resp.Status + "'.")
			}
			break
		}
		return &r, nil
	}
	return nil, schemas.ErrResponsesOff.New("the response kept changing")
}
