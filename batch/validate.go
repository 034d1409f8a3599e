package batch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// maxReported bounds the errors a failed validation lists.
const maxReported = 100

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
	r, err := s.files.Get(ctx, rec.InputFileID)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return checked{errs: []BatchError{lineErr(0, "invalid_file", "input_file_id", "The input file "+rec.InputFileID+" no longer exists.")}}, nil
	}
	if err != nil {
		return checked{}, err
	}
	defer func() { _ = r.Close() }()
	var c checked
	seen := map[string]struct{}{}
	allowedCache := map[string]bool{}
	var allowErr error
	add := func(e BatchError) bool {
		c.errs = append(c.errs, e)
		return len(c.errs) < maxReported
	}
	err = lines(r, s.cfg.MaxLineBytes, func(n int, line []byte) bool {
		c.total++
		if c.total > s.cfg.MaxLines {
			return add(lineErr(0, "too_many_requests", "", fmt.Sprintf(
				"The batch input file has more than the %d requests a batch may have.", s.cfg.MaxLines)))
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
		if _, dup := seen[id]; dup {
			return add(lineErr(n, "duplicate_custom_id", "custom_id",
				"The custom_id for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch."))
		}
		seen[id] = struct{}{}
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
					"The API key of this batch may not use the model '%s'.", *body.Model)))
			}
		}
		return true
	})
	if err == nil {
		err = allowErr
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
	r, err := s.files.Get(ctx, rec.InputFileID)
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
