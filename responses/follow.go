package responses

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/schemas"
)

// Following a response's events live (a streamed background response, a
// resumable chat stream) needs a JetStream consumer: an ordered one on the
// response's subject. Each is owned by its Follow: deleted when the follow
// ends, bounded per tenant and per store (gateway), and given a short
// inactivity threshold so that the server removes those of a gateway that
// died. The events stream's own consumer limit (eventConsumers) is set
// explicitly above what the gateways may hold together.

// followInactive: the server removes a follow's consumer after this long
// without a pull, when its gateway died without deleting it. A live follow
// always has a pull request waiting; a slow client's is renewed by the
// ordered consumer, which recreates a removed one where it stopped.
const followInactive = 30 * time.Second

// followers bounds the follows of one Store, in all and per tenant.
type followers struct {
	mu       sync.Mutex
	max, per int
	n        int
	byTenant map[string]int
}

func newFollowers(max, per int) *followers {
	return &followers{max: max, per: per, byTenant: map[string]int{}}
}

// take counts one follow of tenant, or says which bound it would pass.
func (f *followers) take(tenant string) (release func(), err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byTenant[tenant] >= f.per {
		return nil, schemas.ErrTooManyFollows.New(f.per)
	}
	if f.n >= f.max {
		return nil, schemas.ErrFollowsFull.New(f.max)
	}
	f.n++
	f.byTenant[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.n--
			if f.byTenant[tenant]--; f.byTenant[tenant] <= 0 {
				delete(f.byTenant, tenant)
			}
		})
	}, nil
}

// Follow is one follow of the events of a response or chat stream. Open
// it before answering (every error, a bound included, is then still an
// HTTP status), read it once (Events or Chat), and Close it.
type Follow struct {
	s       *Store
	id      string
	cons    jetstream.Consumer
	release func()
}

// OpenFollow takes one of tenant's follows and makes the consumer of id's
// events. id need not have events yet (a response just queued).
func (s *Store) OpenFollow(ctx context.Context, tenant, id string) (*Follow, error) {
	if !validID(id) {
		return nil, schemas.ErrResponseNotFound.New(id)
	}
	release, err := s.follow.take(tenant)
	if err != nil {
		return nil, err
	}
	c, err := s.events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{EventPrefix + id},
		InactiveThreshold: followInactive, MaxResetAttempts: 5})
	if err != nil {
		release()
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMaximumConsumersLimit {
			return nil, schemas.ErrFollowsFull.New(eventConsumers)
		}
		return nil, unavailable(err)
	}
	return &Follow{s: s, id: id, cons: c, release: release}, nil
}

// Close deletes the follow's consumer and gives its slot back. It works
// on a full store (a delete needs no room) and outlives ctx.
func (f *Follow) Close(ctx context.Context) {
	if f.release == nil {
		return
	}
	if info := f.cons.CachedInfo(); info != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = f.s.events.DeleteConsumer(dctx, info.Name) // else the inactivity threshold
		cancel()
	}
	f.release()
	f.release = nil
}

// Events calls fn with each event whose sequence_number is over after, in
// order, stored ones first then live ones, until a terminal event, fn's
// error or ctx's end.
func (f *Follow) Events(ctx context.Context, after int, fn func(ev *Event, raw []byte) error) error {
	return f.messages(ctx, func(data []byte) (bool, error) {
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

// Chat calls fn with each line of a chat stream after the after-th (n
// counts from 1), stored ones then live ones, until [DONE] or an error
// line (both given to fn), fn's error or ctx's end.
func (f *Follow) Chat(ctx context.Context, after int, fn func(n int, line []byte) error) error {
	n := 0
	return f.messages(ctx, func(data []byte) (bool, error) {
		n++
		if n > after {
			if err := fn(n, data); err != nil {
				return true, err
			}
		}
		return chatEnd(data), nil
	})
}

// messages calls fn with each message of the subject until fn says stop
// or fails, or ctx ends.
func (f *Follow) messages(ctx context.Context, fn func(data []byte) (stop bool, err error)) error {
	// A small buffer: a follow's memory is bounded by it (events are
	// small; the terminal one holds the output).
	it, err := f.cons.Messages(jetstream.PullMaxMessages(64))
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
		if done, err := fn(m.Data()); done || err != nil {
			return err
		}
	}
}
