package batch

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/schemas"
)

// CancelKeyBatches cancels every batch of API key keyID not yet ended, as
// its tenant would (they go to cancelling; a runner answers their lines not
// yet run as key_revoked and ends them cancelled): the admin API does it
// when it deletes the key. Batches finalising already are left to end.
// It returns how many it cancelled.
//
// It reads every record once (one ordered consumer, not a request per
// record); deleting a key is rare. Runners stop the key's lines without it
// too (RunnerConfig.KeyRevoked): this makes the batches say so at once,
// and reaches batches no runner is looking at.
func (s *Store) CancelKeyBatches(ctx context.Context, keyID string) (int, error) {
	if keyID == "" {
		return 0, nil
	}
	var mine []record
	err := s.eachRecord(ctx, func(rec record) {
		if rec.KeyID == keyID && !terminal(rec.Status) {
			mine = append(mine, rec)
		}
	})
	if err != nil {
		return 0, unavailable(err)
	}
	n := 0
	for _, rec := range mine {
		_, err := s.CancelBatch(ctx, rec.Tenant, rec.ID)
		switch {
		case err == nil:
			n++
		case schemas.ErrBatchState.Is(schemas.AsError(err)), schemas.ErrBatchNotFound.Is(schemas.AsError(err)):
			// ended (or finalising) since it was read
		default:
			return n, err
		}
	}
	return n, nil
}

// eachRecord calls fn with every batch record, read by one watcher of the
// bucket (its values as of now, then it stops).
func (s *Store) eachRecord(ctx context.Context, fn func(rec record)) error {
	w, err := s.batches.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the batches bucket's watcher ended early")
			}
			if e == nil {
				return nil // every record delivered
			}
			var rec record
			if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &rec) == nil {
				fn(rec)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// maxPayload is the largest message the NATS connection may publish.
func (s *Store) maxPayload() int64 { return s.js.Conn().MaxPayload() }
