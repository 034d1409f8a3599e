package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lease takes batch id for this runner, for d, if it is in status want and
// no other runner holds it; ok is false when it is not to be had.
func (r *Runner) lease(ctx context.Context, id string, d time.Duration, want ...string) (rec record, rev uint64, ok bool) {
	rec, rev, err := r.s.get(ctx, id)
	if err != nil {
		return record{}, 0, false
	}
	now := time.Now()
	status := false
	for _, w := range want {
		status = status || rec.Status == w
	}
	if !status || (rec.Leaser != r.cfg.ID && rec.LeaseUntil >= now.UnixMilli()) {
		return record{}, 0, false
	}
	rec.Leaser, rec.LeaseUntil = r.cfg.ID, now.Add(d).UnixMilli()
	if err := r.s.put(ctx, rec, rev); err != nil {
		return record{}, 0, false // another runner was quicker, or JetStream is away
	}
	rec, rev, err = r.s.get(ctx, id)
	return rec, rev, err == nil && rec.Leaser == r.cfg.ID
}

// change applies fn to batch id's record and writes it, reading it again
// while another writer was quicker (fn sees the fresh record; false from
// fn leaves it).
func (r *Runner) change(ctx context.Context, id string, fn func(rec *record) bool) (record, error) {
	for {
		rec, rev, err := r.s.get(ctx, id)
		if err != nil {
			return record{}, err
		}
		if !fn(&rec) {
			return rec, nil
		}
		err = r.s.put(ctx, rec, rev)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err == nil {
			r.note(rec)
		}
		return rec, err
	}
}

// release gives up this runner's lease on id now, so another may try.
func (r *Runner) release(ctx context.Context, id string) { r.retryLater(ctx, id, 0) }

// retryLater gives up this runner's lease on id, and lets no runner take
// it before d has passed: a validation or finalisation that failed for
// want of JetStream or Redis is not tried again every Poll.
func (r *Runner) retryLater(ctx context.Context, id string, d time.Duration) {
	until := int64(0)
	if d > 0 {
		until = time.Now().Add(d).UnixMilli()
	}
	_, _ = r.change(ctx, id, func(rec *record) bool {
		if rec.Leaser != r.cfg.ID {
			return false
		}
		rec.Leaser, rec.LeaseUntil = "", until
		return true
	})
}

// purgeLines removes every queued line of batch id and its consumer: it
// ended (or never started) with lines left, which no runner will take.
func (r *Runner) purgeLines(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = r.s.work.DeleteConsumer(cctx, consumerName(id))
	_ = r.s.work.Purge(cctx, jetstream.WithPurgeSubject(WorkPrefix+id))
	r.mu.Lock()
	delete(r.cons, id)
	r.mu.Unlock()
}

// Output file ids of a batch: fixed, so that a finalisation run again
// after a crash replaces what the first one wrote.
func outputFileID(id string) string { return "file-" + id[len("batch_"):] + "-output" }
func errorFileID(id string) string  { return "file-" + id[len("batch_"):] + "-errors" }

// finalize writes a batch's output and error files from its results, each
// custom_id once, and ends it: completed, cancelled or expired. It holds
// the finalizing lease; a runner that dies midway leaves it to expire and
// the next one writes the files again under the same ids.
func (r *Runner) finalize(ctx context.Context, id string) {
	rec, _, ok := r.lease(ctx, id, leaseFor, StatusInProgress, StatusCancelling, StatusFinalizing)
	if !ok {
		return
	}
	before := rec.Status
	if rec.Status != StatusFinalizing {
		now := time.Now().Unix()
		var err error
		if rec, err = r.change(ctx, id, func(x *record) bool {
			if x.Status != before || x.Leaser != r.cfg.ID {
				return false
			}
			x.Status, x.FinalizingAt = StatusFinalizing, &now
			return true
		}); err != nil || rec.Status != StatusFinalizing {
			r.release(ctx, id)
			return
		}
	}
	res, err := r.s.writeOutputs(ctx, rec)
	if err != nil {
		// JetStream failed (or this runner is stopping): finalising again
		// after retryAfter, by any runner, not at once and every Poll.
		r.log.Warn("batch: finalising failed; will retry", "batch", id, "err", err, "after", retryAfter)
		r.retryLater(ctx, id, retryAfter)
		return
	}
	if res.ok+res.failed < rec.RequestCounts.Total {
		// Results missing (a repeat counted twice made the batch look
		// done): back to running, and not finalised again for a while.
		r.log.Warn("batch: finalising found results missing; back to running", "batch", id, "answered", res.ok+res.failed,
			"total", rec.RequestCounts.Total)
		until := time.Now().Add(retryAfter).UnixMilli()
		_, _ = r.change(ctx, id, func(x *record) bool {
			if x.Status != StatusFinalizing || x.Leaser != r.cfg.ID {
				return false
			}
			x.Status, x.FinalizingAt, x.Leaser, x.LeaseUntil = StatusInProgress, nil, "", until
			if x.CancellingAt != nil {
				x.Status = StatusCancelling
			}
			return true
		})
		return
	}
	now := time.Now().Unix()
	rec, err = r.change(ctx, id, func(x *record) bool {
		if x.Status != StatusFinalizing || x.Leaser != r.cfg.ID {
			return false
		}
		switch {
		case x.CancellingAt != nil:
			x.Status, x.CancelledAt = StatusCancelled, &now
		case res.expired > 0:
			x.Status, x.ExpiredAt = StatusExpired, &now
		default:
			x.Status, x.CompletedAt = StatusCompleted, &now
		}
		x.RequestCounts.Completed, x.RequestCounts.Failed = res.ok, res.failed
		x.OutputFileID, x.ErrorFileID = res.output, res.errors
		x.Leaser, x.LeaseUntil = "", 0
		return true
	})
	if err != nil || !terminal(rec.Status) {
		return
	}
	// Ended: what ran it can go. Left behind by a crash, the consumer
	// goes by its inactivity threshold and the results by their age.
	r.purgeLines(ctx, id)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = r.s.results.Purge(cctx, jetstream.WithPurgeSubject(ResultPrefix+id+".*"))
}

// forceEnd ends a batch stuck forceEndAfter past its expires_at (its
// finalisation kept failing, or its lines could not be taken): expired, or
// cancelled if it was being cancelled, without output files, with an
// errors entry saying so. Its lines not yet run are purged; its answers stay
// in the results stream until they age out (ResultsMaxAge), for an operator
// to recover.
func (r *Runner) forceEnd(ctx context.Context, id string) {
	ok, failed, _ := r.s.resultCounts(ctx, id)
	now := time.Now()
	rec, err := r.change(ctx, id, func(x *record) bool {
		if !stuck(*x, now) {
			return false
		}
		at := now.Unix()
		if x.CancellingAt != nil {
			x.Status, x.CancelledAt = StatusCancelled, &at
		} else {
			x.Status, x.ExpiredAt = StatusExpired, &at
		}
		x.RequestCounts.Completed = min(ok, x.RequestCounts.Total)
		x.RequestCounts.Failed = min(failed, x.RequestCounts.Total-x.RequestCounts.Completed)
		x.Errors = &BatchErrors{Object: "list", Data: []BatchError{lineErr(0, "not_finalized", "", fmt.Sprintf(
			"The batch could not be finalised within %s after its completion window ended; it was ended without its output files.", forceEndAfter))}}
		x.Leaser, x.LeaseUntil = "", 0
		return true
	})
	if err != nil || !terminal(rec.Status) {
		return
	}
	r.log.Warn("batch: ended without its output files: not finalised long after it expired", "batch", id, "status", rec.Status)
	r.purgeLines(ctx, id)
}

// outputs is what writeOutputs wrote.
type outputs struct {
	ok, failed, expired int
	output, errors      *string // file ids; nil when there was no line for it
}

// writeOutputs reads every result of rec and writes each custom_id's first
// into the output file (a 2xx response) or the error file (the rest).
func (s *Store) writeOutputs(ctx context.Context, rec record) (outputs, error) {
	var res outputs
	info, err := s.results.Info(ctx, jetstream.WithSubjectFilter(ResultPrefix+rec.ID+".*"))
	if err != nil {
		return res, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	okW := newLazyFile(ctx, s, outputFileID(rec.ID), rec.Tenant, rec.ID+"_output.jsonl")
	errW := newLazyFile(ctx, s, errorFileID(rec.ID), rec.Tenant, rec.ID+"_error.jsonl")
	defer okW.abort()
	defer errW.abort()
	if n > 0 {
		// Its own consumer, deleted when done (the server's default
		// inactivity threshold would keep it 5 minutes, counted against
		// the stream's consumer limit); a runner that dies leaves it to
		// the short threshold.
		cons, err := s.results.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{ResultPrefix + rec.ID + ".*"}, InactiveThreshold: 30 * time.Second})
		if err != nil {
			return res, err
		}
		defer func() {
			if info := cons.CachedInfo(); info != nil {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = s.results.DeleteConsumer(dctx, info.Name)
				cancel()
			}
		}()
		it, err := cons.Messages()
		if err != nil {
			return res, err
		}
		stop := context.AfterFunc(ctx, it.Stop)
		seen := map[string]struct{}{}
		for {
			msg, err := it.Next()
			if err != nil {
				it.Stop()
				stop()
				return res, err
			}
			var out OutputLine
			if json.Unmarshal(msg.Data(), &out) == nil {
				if _, dup := seen[out.CustomID]; !dup {
					seen[out.CustomID] = struct{}{}
					w := errW
					switch {
					case out.Response != nil && out.Response.StatusCode/100 == 2:
						w = okW
						res.ok++
					case out.Error != nil && out.Error.Code == "batch_expired":
						res.expired++
						res.failed++
					default:
						res.failed++
					}
					if err := w.write(append(msg.Data(), '\n')); err != nil {
						it.Stop()
						stop()
						return res, err
					}
				}
			}
			md, err := msg.Metadata()
			if err != nil || md.NumPending == 0 {
				break
			}
		}
		it.Stop()
		stop()
	}
	if res.output, err = okW.close(); err != nil {
		return res, err
	}
	if res.errors, err = errW.close(); err != nil {
		return res, err
	}
	return res, nil
}

// lazyFile streams lines into a file of the store, begun at its first line.
type lazyFile struct {
	ctx              context.Context
	s                *Store
	id, tenant, name string
	pw               *io.PipeWriter
	done             chan error
	closed           bool
}

func newLazyFile(ctx context.Context, s *Store, id, tenant, name string) *lazyFile {
	return &lazyFile{ctx: ctx, s: s, id: id, tenant: tenant, name: name}
}

func (f *lazyFile) write(b []byte) error {
	if f.pw == nil {
		pr, pw := io.Pipe()
		f.pw, f.done = pw, make(chan error, 1)
		go func() {
			_, err := f.s.putFile(f.ctx, f.id, f.tenant, f.name, "batch_output", pr, 0)
			_ = pr.CloseWithError(err) // a writer waiting on a failed put ends
			f.done <- err
		}()
	}
	_, err := f.pw.Write(b)
	return err
}

// close ends the file and returns its id (nil when nothing was written).
func (f *lazyFile) close() (*string, error) {
	f.closed = true
	if f.pw == nil {
		return nil, nil
	}
	_ = f.pw.Close()
	if err := <-f.done; err != nil {
		return nil, err
	}
	return &f.id, nil
}

// abort ends an unfinished file (its put fails and stores nothing).
func (f *lazyFile) abort() {
	if f.closed || f.pw == nil {
		return
	}
	_ = f.pw.CloseWithError(errors.New("finalisation abandoned"))
	<-f.done
}
