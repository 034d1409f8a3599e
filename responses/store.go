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
	// EventPrefix + <response-id>: its events, one message each, in order.
	EventPrefix = schemas.Prefix + ".responses.events."
	// WorkPrefix + <response-id>: a background response to run.
	WorkPrefix = schemas.Prefix + ".responses.work."
)

// Config tunes a Store.
type Config struct {
	Replicas  int           // default 1
	Retention time.Duration // how long responses and their events are kept; default 30 days (OpenAI's)
}

// Store keeps responses in JetStream, shared by every gateway.
type Store struct {
	cfg    Config
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	events jetstream.Stream
	work   jetstream.Stream
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
}

// Conversation is what a response continuing this one is preceded by.
func (r *Record) Conversation() []Item {
	out := make([]Item, 0, len(r.History)+len(r.Input)+len(r.Response.Output))
	out = append(out, r.History...)
	out = append(out, r.Input...)
	return append(out, r.Response.Output...)
}

// New is the response object of req, in progress.
func New(id string, req *CreateRequest, created time.Time) *Response {
	r := &Response{ID: id, Object: "response", CreatedAt: created.Unix(), Status: StatusInProgress,
		Background: req.Background, Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens,
		Model: req.Model, Output: []Item{}, ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		PreviousResponseID: req.PreviousResponseID, Store: req.Stored(), Temperature: req.Temperature, TopP: req.TopP,
		Text: json.RawMessage(`{"format":{"type":"text"}}`), ToolChoice: json.RawMessage(`"auto"`), Tools: req.Tools,
		Truncation: "disabled", Metadata: req.Metadata}
	if len(req.ToolChoice) > 0 && string(req.ToolChoice) != "null" {
		r.ToolChoice = req.ToolChoice
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

// Open makes (or finds) the bucket and streams.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, js: js}
	if s.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "tokenbus responses: one record per stored response", Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, History: 1, TTL: cfg.Retention}); err != nil {
		return nil, fmt.Errorf("responses bucket: %w", err)
	}
	if s.events, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: EventStream,
		Description: "tokenbus background responses' events, for streams resumed on any gateway",
		Subjects:    []string{EventPrefix + "*"}, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		MaxAge: cfg.Retention}); err != nil {
		return nil, fmt.Errorf("response events stream: %w", err)
	}
	if s.work, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: WorkStream,
		Description: "tokenbus background responses to run", Subjects: []string{WorkPrefix + "*"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		Duplicates: 2 * time.Minute}); err != nil {
		return nil, fmt.Errorf("response work stream: %w", err)
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

// Delete removes a response of tenant and its events.
func (s *Store) Delete(ctx context.Context, tenant, id string) error {
	if _, _, err := s.Get(ctx, tenant, id); err != nil {
		return err
	}
	if err := s.kv.Delete(ctx, id); err != nil {
		return unavailable(err)
	}
	if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(EventPrefix+id)); err != nil {
		return unavailable(err)
	}
	return nil
}

// Submit stores a background response (queued) and queues it for a runner.
func (s *Store) Submit(ctx context.Context, rec *Record) error {
	if err := s.Put(ctx, rec); err != nil {
		return err
	}
	id := rec.Response.ID
	if _, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: WorkPrefix + id, Data: []byte(id),
		Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}); err != nil {
		return unavailable(err)
	}
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
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return 0, errConflict
		}
		return 0, err
	}
	if ack.Duplicate {
		return 0, errConflict
	}
	return ack.Sequence, nil
}

// Follow calls fn with each event of response id whose sequence_number is
// over after, in order, stored ones first then live ones, until a terminal
// event, fn's error or ctx's end.
func (s *Store) Follow(ctx context.Context, id string, after int, fn func(ev *Event, raw []byte) error) error {
	return s.follow(ctx, id, func(_ uint64, data []byte) (bool, error) {
		var ev Event
		if json.Unmarshal(data, &ev) != nil {
			return false, nil
		}
		if ev.SequenceNumber > after {
			if err := fn(&ev, data); err != nil {
				return true, err
			}
		}
		return ev.Terminal(), nil
	})
}

// follow calls fn with each message of id's events subject (its stream
// sequence and data), stored ones then live ones, until fn says stop or
// fails, or ctx ends.
func (s *Store) follow(ctx context.Context, id string, fn func(seq uint64, data []byte) (stop bool, err error)) error {
	c, err := s.events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{EventPrefix + id}})
	if err != nil {
		return unavailable(err)
	}
	it, err := c.Messages()
	if err != nil {
		return unavailable(err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return unavailable(err)
		}
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		if done, err := fn(seq, m.Data()); done || err != nil {
			return err
		}
	}
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

// replay reads the events stored for id into gen; it returns the stream
// sequence of the last one (0: none).
func (s *Store) replay(ctx context.Context, id string, gen *Gen) (uint64, error) {
	last, err := s.lastEvent(ctx, id)
	if err != nil || last == 0 {
		return 0, err
	}
	err = s.follow(ctx, id, func(seq uint64, data []byte) (bool, error) {
		var ev Event
		if json.Unmarshal(data, &ev) == nil {
			gen.Replay(&ev)
		}
		return seq >= last, nil
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
		if _, err := s.update(ctx, rec, rev); err != nil {
			continue // changed meanwhile: read again
		}
		ev := Event{Type: "response.cancelled", SequenceNumber: gen.Seq(), Response: &r}
		if _, err := s.append(ctx, id, &ev, last); errors.Is(err, errConflict) {
			// The runner appended meanwhile: it will see the cancelled
			// record at its end; append after its event.
			if last, err = s.replay(ctx, id, gen); err == nil && !gen.Ended() {
				ev.SequenceNumber = gen.Seq()
				_, _ = s.append(ctx, id, &ev, last)
			}
		}
		return &r, nil
	}
	return nil, schemas.ErrResponsesOff.New("the response kept changing")
}
