package batch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of what a failed validation reports, so that its record stays far
// below NATS's max payload (1 MiB by default) however hostile the file: at
// most maxReported errors, together at most maxErrorsBytes as JSON, each
// value quoted from the file at most maxQuoted bytes.
const (
	maxReported    = 100
	maxErrorsBytes = 64 << 10
	maxQuoted      = 128
)

// maxCustomID bounds a custom_id: it is in every result's Nats-Msg-Id
// header and output line, and a result that cannot be stored would run
// again for ever.
const maxCustomID = 1024

// quote is a value of the input file as an error message quotes it: at
// most maxQuoted bytes (cut at a character boundary), and its length when
// it was cut.
func quote(v string) string {
	if len(v) <= maxQuoted {
		return v
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", v[:cut], len(v))
}

// lineErr makes one entry of a failed batch's errors.data.
func lineErr(line int, code, param, msg string) BatchError {
	e := BatchError{Code: code, Message: msg}
	if line > 0 {
		e.Line = &line
	}
	if param != "" {
		e.Param = &param
	}
	return e
}

// lines calls fn with every line of r that is not blank, numbered from 1,
// until fn returns false. A line longer than max is passed as nil (its
// bytes are skipped). The slice is valid only during the call.
func lines(r io.Reader, max int, fn func(n int, line []byte) bool) error {
	br := bufio.NewReaderSize(r, max+1)
	n := 0
	for {
		n++
		b, err := br.ReadSlice('\n')
		long := false
		for errors.Is(err, bufio.ErrBufferFull) {
			long = true
			_, err = br.ReadSlice('\n')
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		switch {
		case long:
			if !fn(n, nil) {
				return nil
			}
		case len(bytes.TrimSpace(b)) > 0:
			if !fn(n, b) {
				return nil
			}
		}
		if err != nil { // io.EOF
			return nil
		}
	}
}

// envelope is what validation reads of a line.
type envelope struct {
	CustomID json.RawMessage `json:"custom_id"`
	Method   json.RawMessage `json:"method"`
	URL      json.RawMessage `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// bodyHead is what validation reads of a line's body.
type bodyHead struct {
	Model  *string `json:"model"`
	Stream *bool   `json:"stream"`
}

// checked is the outcome of validating an input file.
type checked struct {
	errs  []BatchError
	total int
	model string
}

// check reads rec's input file and validates every line as OpenAI does:
// JSON, a unique string custom_id, method POST, url the batch's endpoint, a
// body object naming one model for the whole batch (allowed for the key),
// not streaming, within the line and size limits.
func (s *Store) check(ctx context.Context, rec record, allowed func(model string) (bool, error)) (checked, error) {
	r, err := s.readChunks(ctx, rec.InputFileID)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return checked{errs: []BatchError{lineErr(0, "invalid_file", "input_file_id", "The input file "+rec.InputFileID+" no longer exists.")}}, nil
	}
	if err != nil {
		return checked{}, err
	}
	defer func() { _ = r.Close() }()
	var c checked
	// custom_ids seen, by their SHA-256: 32 bytes each, however long
	// they are (up to maxCustomID).
	seen := map[[sha256.Size]byte]struct{}{}
	allowedCache := map[string]bool{}
	var allowErr error
	reported := 0 // bytes of c.errs as JSON
	add := func(e BatchError) bool {
		b, _ := json.Marshal(e)
		if reported+len(b) > maxErrorsBytes {
			return false
		}
		reported += len(b)
		c.errs = append(c.errs, e)
		return len(c.errs) < maxReported
	}
	err = lines(r, s.cfg.MaxLineBytes, func(n int, line []byte) bool {
		if ctx.Err() != nil {
			return false // out of time, or cancelled: check returns why
		}
		c.total++
		if c.total > s.cfg.MaxLines {
			add(lineErr(0, "too_many_requests", "", fmt.Sprintf(
				"The batch input file has more than the %d requests a batch may have.", s.cfg.MaxLines)))
			return false
		}
		if line == nil {
			return add(lineErr(n, "line_too_large", "", fmt.Sprintf(
				"This line is larger than the %d bytes a request of a batch may have.", s.cfg.MaxLineBytes)))
		}
		var env envelope
		if json.Unmarshal(line, &env) != nil {
			return add(lineErr(n, "invalid_json_line", "", "This line is not parseable as valid JSON."))
		}
		var id string
		if len(env.CustomID) == 0 || string(env.CustomID) == "null" {
			return add(lineErr(n, "missing_required_parameter", "custom_id", "Missing required parameter: 'custom_id'."))
		}
		if json.Unmarshal(env.CustomID, &id) != nil || id == "" {
			return add(lineErr(n, "invalid_type", "custom_id", "The custom_id of a request must be a non-empty string."))
		}
		if len(id) > maxCustomID {
			return add(lineErr(n, "invalid_value", "custom_id", fmt.Sprintf(
				"The custom_id of a request may be at most %d bytes; this one has %d.", maxCustomID, len(id))))
		}
		sum := sha256.Sum256([]byte(id))
		if _, dup := seen[sum]; dup {
			return add(lineErr(n, "duplicate_custom_id", "custom_id",
				"The custom_id for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch."))
		}
		seen[sum] = struct{}{}
		var method, url string
		_ = json.Unmarshal(env.Method, &method)
		_ = json.Unmarshal(env.URL, &url)
		if method != "POST" {
			return add(lineErr(n, "invalid_method", "method", "The method of a request must be POST."))
		}
		if url != rec.Endpoint {
			return add(lineErr(n, "invalid_url", "url", fmt.Sprintf(
				"The url of this request does not match the batch's endpoint %s.", rec.Endpoint)))
		}
		var body bodyHead
		if len(env.Body) == 0 || env.Body[0] != '{' || json.Unmarshal(env.Body, &body) != nil {
			return add(lineErr(n, "missing_required_parameter", "body", "The body of a request must be a JSON object."))
		}
		switch {
		case body.Model == nil || *body.Model == "":
			return add(lineErr(n, "missing_required_parameter", "body.model", "Missing required parameter: 'body.model'."))
		case c.model == "":
			c.model = *body.Model
		case *body.Model != c.model:
			return add(lineErr(n, "mismatched_model", "body.model",
				"The provided model does not match the model of the other requests in the batch: a batch uses one model."))
		}
		if body.Stream != nil && *body.Stream {
			return add(lineErr(n, "invalid_value", "body.stream", "Streaming is not supported in a batch; leave stream unset or false."))
		}
		if allowed != nil {
			ok, known := allowedCache[*body.Model]
			if !known {
				ok, allowErr = allowed(*body.Model)
				if allowErr != nil {
					return false
				}
				allowedCache[*body.Model] = ok
			}
			if !ok {
				return add(lineErr(n, "model_not_allowed", "body.model", fmt.Sprintf(
					"The API key of this batch may not use the model '%s'.", quote(*body.Model))))
			}
		}
		return true
	})
	if err == nil {
		err = allowErr
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return checked{}, err
	}
	if c.total == 0 {
		c.errs = append(c.errs, lineErr(0, "empty_file", "input_file_id", "The batch input file is empty."))
	}
	return c, nil
}

// enqueue publishes every line of rec's input file to its work subject, at
// most window unacknowledged at a time. Each has Nats-Msg-Id
// <batch-id>/<line>, so queueing again after a crash adds no line twice
// (within the work stream's de-duplication window; lines are queued only
// while a batch validates, well within it).
func (s *Store) enqueue(ctx context.Context, rec record) error {
	r, err := s.readChunks(ctx, rec.InputFileID)
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }()
	const window = 512
	var pending []jetstream.PubAckFuture
	settle := func() error {
		for _, f := range pending {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		pending = pending[:0]
		return nil
	}
	subject := WorkPrefix + rec.ID
	var perr error
	err = lines(r, s.cfg.MaxLineBytes, func(n int, line []byte) bool {
		if perr = ctx.Err(); perr != nil {
			return false
		}
		ln := strconv.Itoa(n)
		m := &nats.Msg{Subject: subject, Data: bytes.Clone(bytes.TrimSpace(line)), Header: nats.Header{
			jetstream.MsgIDHeader: []string{rec.ID + "/" + ln}, HdrLine: []string{ln}}}
		f, err := s.js.PublishMsgAsync(m)
		if err != nil {
			perr = err
			return false
		}
		pending = append(pending, f)
		if len(pending) >= window {
			if perr = settle(); perr != nil {
				return false
			}
		}
		return true
	})
	if err == nil {
		err = perr
	}
	if err == nil {
		err = settle()
	}
	return err
}

// Why a validation stopped before its end (context.Cause of its context).
var (
	errValidationTimeout = errors.New("validation took longer than its limit")
	errExpiredMidway     = errors.New("the batch expired while it was validated")
)

// validationLease is how long a validation holds its batch: longer than it
// may take, so that no other runner starts one beside it.
func (r *Runner) validationLease() time.Duration { return r.cfg.ValidationTimeout + 30*time.Second }

// validate checks a validating batch's input file and queues its lines:
// in_progress, or failed with OpenAI's errors. It is bounded: at most
// ValidationTimeout (then failed, validation_timeout) and never past
// expires_at (then expired); a cancel stops it at once (then cancelled).
// A runner that dies midway leaves the lease to lapse; the next one starts
// over (queueing is idempotent). Memory is bounded too: one line at a time,
// 32 bytes per custom_id, and the bounded errors.
func (r *Runner) validate(ctx context.Context, id string) {
	rec, _, ok := r.lease(ctx, id, r.validationLease(), StatusValidating)
	if !ok {
		return
	}
	now := time.Now()
	if errs := r.revokedErrors(ctx, rec); errs != nil {
		r.endUnvalidated(ctx, id, StatusCancelled, errs, 0)
		return
	}
	deadline, why := now.Add(r.cfg.ValidationTimeout), errValidationTimeout
	if rec.ExpiresAt != nil && time.Unix(*rec.ExpiresAt, 0).Before(deadline) {
		deadline, why = time.Unix(*rec.ExpiresAt, 0), errExpiredMidway
	}
	vctx, cancelT := context.WithDeadlineCause(ctx, deadline, why)
	defer cancelT()
	vctx, stop := context.WithCancelCause(vctx)
	defer stop(nil)
	r.mu.Lock()
	r.validating[id] = stop
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.validating, id)
		r.mu.Unlock()
	}()
	r.stopValidations() // a cancel seen before the line above

	var allowed func(string) (bool, error)
	if r.cfg.ModelAllowed != nil && rec.KeyID != "" {
		allowed = func(model string) (bool, error) { return r.cfg.ModelAllowed(vctx, rec.KeyID, model) }
	}
	c, err := r.s.check(vctx, rec, allowed)
	if err == nil && len(c.errs) == 0 {
		err = r.s.enqueue(vctx, rec)
	}
	if err != nil {
		cause := context.Cause(vctx)
		if cause == nil && !time.Now().Before(deadline) {
			cause = why // the object store's read timed out on the deadline before the context did
		}
		switch {
		case ctx.Err() != nil:
			r.release(ctx, id) // stopping: another runner starts over
		case errors.Is(cause, errValidationTimeout):
			r.log.Warn("batch: validation took too long; the batch fails", "batch", id, "limit", r.cfg.ValidationTimeout)
			r.endUnvalidated(ctx, id, StatusFailed, []BatchError{lineErr(0, "validation_timeout", "input_file_id", fmt.Sprintf(
				"The batch input file could not be validated within %s.", r.cfg.ValidationTimeout))}, 0)
		case errors.Is(cause, errExpiredMidway):
			r.endUnvalidated(ctx, id, StatusExpired, nil, 0)
		case errors.Is(cause, errCancelled):
			r.endUnvalidated(ctx, id, StatusCancelled, nil, 0)
		default:
			r.log.Warn("batch: validation could not read the input file or queue its lines; will retry", "batch", id, "err", err, "after", retryAfter)
			r.retryLater(ctx, id, retryAfter)
		}
		return
	}
	if len(c.errs) > 0 {
		r.endUnvalidated(ctx, id, StatusFailed, c.errs, c.total)
		return
	}
	started := time.Now().Unix()
	rec, err = r.change(ctx, id, func(x *record) bool {
		switch {
		case x.Status == StatusValidating:
			x.Status, x.InProgressAt = StatusInProgress, &started
			x.RequestCounts.Total, x.Model = c.total, c.model
		case unvalidated(*x): // cancelled as its lines were queued: none will run
			x.Status, x.CancelledAt = StatusCancelled, &started
		default:
			return false
		}
		x.Leaser, x.LeaseUntil = "", 0
		return true
	})
	switch {
	case err != nil:
		// The lines are queued; the lease lapses and a runner queues them
		// again (de-duplicated) and starts the batch.
		r.log.Warn("batch: could not start a validated batch; will retry", "batch", id, "err", err)
	case rec.Status != StatusInProgress:
		r.purgeLines(ctx, id) // it ended meanwhile: what was queued goes
	}
}

// endUnvalidated ends batch id, whose lines were not (all) queued: status
// failed (with errs, and total, the lines read), expired or cancelled; a
// batch cancelled meanwhile ends cancelled whatever the reason. Any runner
// may, whoever holds the validation lease: a validation's last write is a
// compare-and-set that finds the batch ended. What was queued is purged.
func (r *Runner) endUnvalidated(ctx context.Context, id, status string, errs []BatchError, total int) {
	now := time.Now().Unix()
	write := func(errs []BatchError) (record, error) {
		return r.change(ctx, id, func(x *record) bool {
			if x.Status != StatusValidating && !unvalidated(*x) {
				return false
			}
			st := status
			if x.Status == StatusCancelling {
				st = StatusCancelled
			}
			switch st {
			case StatusFailed:
				x.FailedAt = &now
				x.RequestCounts.Total = total
			case StatusExpired:
				x.ExpiredAt = &now
			case StatusCancelled:
				x.CancelledAt = &now
			}
			x.Status, x.Leaser, x.LeaseUntil = st, "", 0
			if len(errs) > 0 {
				x.Errors = &BatchErrors{Object: "list", Data: errs}
			}
			return true
		})
	}
	rec, err := write(errs)
	if errors.Is(err, nats.ErrMaxPayload) && len(errs) > 1 {
		// The record was near the limit already (its metadata): the first
		// error only.
		rec, err = write(errs[:1])
	}
	if err != nil {
		r.log.Warn("batch: could not end a batch that was not validated; will retry", "batch", id, "status", status, "err", err)
		return
	}
	if terminal(rec.Status) {
		r.purgeLines(ctx, id)
	}
}
