package httpengine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

const (
	// SSE read buffer; longer lines are put together. Every stream holds
	// one while it runs (10,000 streams: 160 MB at 16 KiB), and 16 KiB
	// still takes ~60 chunks of a fast engine per read.
	readerSize = 16 << 10
	maxBatch   = 256 << 10 // flush a batch this big even if more lines are ready (bus messages are ~1 MB at most)
)

var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readerSize) }}
	batchPool  = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}
)

// Generate passes req to the server and its answer to sink (see the package
// doc), in a client span that ends with the stream. It ends with ctx or
// req.Deadline, whichever comes first.
func (e *Engine) Generate(ctx context.Context, req *engine.Request, sink engine.Sink) (*engine.Result, error) {
	if e.closed() {
		return nil, errClosed
	}
	// A worker's context carries the deadline already: another timer for
	// the same instant would be one more per request.
	if dl, ok := ctx.Deadline(); !req.Deadline.IsZero() && (!ok || req.Deadline.Before(dl)) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	var path string
	switch req.Kind {
	case schemas.KindChat:
		path = "/v1/chat/completions"
	case schemas.KindCompletion:
		path = "/v1/completions"
	case schemas.KindEmbedding:
		path = "/v1/embeddings"
	case schemas.KindTokenize:
		path = "/tokenize" // vLLM's, at the root
	case schemas.KindDetokenize:
		path = "/detokenize"
	default:
		return nil, schemas.ErrUnknownKind.New(req.Kind)
	}
	if e.cfg.KnownModelsOnly {
		if ms := e.Models(); len(ms) > 0 && !slices.Contains(ms, req.Model) {
			return nil, schemas.ErrModelNotFound.New(req.Model)
		}
	}
	span := e.startSpan(ctx, req, path)
	res, err := e.generate(ctx, req, sink, path, span)
	endSpan(span, res, err)
	return res, err
}

func (e *Engine) generate(ctx context.Context, req *engine.Request, sink engine.Sink, path string, span trace.Span) (*engine.Result, error) {
	e.inflight.Add(1)
	defer e.inflight.Add(-1)

	// The upstream request ends with ctx, with an abort of every request
	// (Close), or with a timer below; it is not a
	// child of ctx so that a finished stream's connection can be given back
	// after Generate returned and the caller cancelled ctx.
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stopCaller := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	abort := e.abortCtx()
	stopAbort := context.AfterFunc(abort, func() { cancel(context.Cause(abort)) })
	var resp *http.Response
	drained := false
	defer func() {
		if drained {
			return
		}
		if resp != nil {
			resp.Body.Close() // unread: this closes the connection, so the server aborts
		}
		stopCaller()
		stopAbort()
		cancel(nil)
	}()

	view, err := boundView(req)
	if err != nil {
		return nil, err
	}
	stream := view.Stream
	// The engine runs the model it was given, never another: a body that
	// names none gets it (an OpenAI server would run its default).
	hreq, err := e.newRequest(rctx, http.MethodPost, path, view.BoundBody())
	if err != nil {
		return nil, schemas.ErrInternal.New("building the engine request: " + err.Error())
	}
	setRequestID(hreq.Header, e.cfg.RequestID, req.ID)
	if tp := traceparent(span, req); tp != "" {
		hreq.Header.Set("Traceparent", tp)
	}

	// A streaming server sends its headers at once, a non-stream one only
	// with the whole completion: the wait for them differs.
	wait, why := e.cfg.ResponseTimeout, errSlow
	if stream {
		wait, why = e.cfg.StallTimeout, errStalled
	}
	timer := time.AfterFunc(wait, func() { cancel(why(wait)) })
	resp, err = e.gen.RoundTrip(hreq)
	if err != nil {
		timer.Stop()
		err = &url.Error{Op: "Post", URL: hreq.URL.String(), Err: err} // as http.Client says it
		return nil, e.failure(ctx, rctx, err, false)
	}
	statusOnSpan(span, resp.StatusCode)

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		timer.Stop() // after the body: a server that stalls in it is cut by the timer
		if err != nil && len(body) == 0 {
			return nil, e.failure(ctx, rctx, err, false)
		}
		var ue *schemas.Error
		if resp.StatusCode == http.StatusNotFound && !req.Kind.Generates() && noRoute(body) {
			// A server without the endpoint (an OpenAI-compatible server
			// that has no /tokenize, or serves no embeddings) answers the
			// route's 404, which would read as "model not found".
			ue = schemas.ErrEngineNoEndpoint.New(e.name, path)
		} else {
			ue = scrubKey(answerError(resp.StatusCode, body, http.MethodPost, path), e.cfg.APIKey)
		}
		ue.RetryAfter = retryAfter(resp.Header)
		// An answer without a body gives the client nothing to go on: the
		// log has it, with where it came from (never the key, which is in a
		// header).
		if len(bytes.TrimSpace(body)) == 0 {
			e.log.Warn("engine error answer with an empty body", "status", resp.StatusCode,
				"url", e.base+path, "request_id", req.ID)
		}
		return nil, ue
	}
	if isEventStream(resp.Header.Get("Content-Type")) {
		timer.Stop()
		res, err := e.stream(ctx, rctx, cancel, resp.Body, sink, view, req.Model)
		if err == nil {
			// Read the body to its end, so the connection goes back to the
			// pool, without making the caller wait for it; a server that
			// holds the connection open after [DONE] gets a second.
			drained = true
			stopCaller()
			finish := func() {
				resp.Body.Close()
				stopAbort()
				cancel(nil)
			}
			if eb, ok := resp.Body.(endBuffered); ok && eb.endBuffered() {
				// The body's end is off the socket already (the usual case):
				// reading it waits for nothing, so no goroutine for it.
				_, _ = io.Copy(io.Discard, resp.Body)
				finish()
				return res, nil
			}
			go func() {
				t := time.AfterFunc(time.Second, func() { cancel(nil) })
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
				t.Stop()
				finish()
			}()
		}
		return res, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, e.cfg.MaxResponseBytes+1))
	timer.Stop()
	if err != nil {
		return nil, e.failure(ctx, rctx, err, true)
	}
	if int64(len(body)) > e.cfg.MaxResponseBytes {
		return nil, engineError("the engine's response is larger than %d bytes", e.cfg.MaxResponseBytes)
	}
	mn := newModelName(req.Model)
	res := &engine.Result{Response: mn.fix(body)}
	if u := schemas.UsageOf(body); u != nil {
		res.Usage = *u
	}
	return res, nil
}

// stream reads an SSE answer; see the package doc.
func (e *Engine) stream(ctx, rctx context.Context, cancel context.CancelCauseFunc, body io.Reader, sink engine.Sink, view *schemas.Request, model string) (*engine.Result, error) {
	stall := e.cfg.StallTimeout
	idle := newIdleTimer(stall, func() { cancel(errStalled(stall)) })
	defer idle.stop()
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(&activityReader{r: body, idle: idle})
	defer func() { br.Reset(nil); readerPool.Put(br) }()
	bp := batchPool.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<20 {
			batchPool.Put(bp)
		}
	}()

	s := sseState{batch: (*bp)[:0], maxLine: e.cfg.MaxLineBytes, key: e.cfg.APIKey, model: newModelName(model),
		includeUsage: view.IncludeUsage, usageAsSent: bytes.Contains(view.Body, []byte(`continuous_usage_stats`))}
	err := s.run(br, sink)
	*bp = s.batch[:0]
	var gone *sinkError
	switch {
	case err == errDone:
		u, estimated := s.usage()
		return &engine.Result{Usage: u, UsageEstimated: estimated}, nil
	case errors.As(err, &gone):
		return nil, gone.err // the request is gone: closing the unfinished body closes the connection
	case errors.As(err, new(*schemas.Error)):
		return nil, err
	default:
		return nil, e.failure(ctx, rctx, err, true)
	}
}

var errDone = errors.New("[DONE]")

// sinkError is an error from Sink.Chunks, kept apart from read errors.
type sinkError struct{ err error }

func (e *sinkError) Error() string { return e.err.Error() }

// sseState is one stream's reading state.
type sseState struct {
	batch   []byte // data lines (never empty) not yet handed to the sink, '\n'-separated
	long    []byte // a line longer than the reader's buffer, put together
	maxLine int
	last    []byte // copy of the last chunk with a usage object
	counted int    // data chunks without usage, the fallback completion count
	chunks  int    // data chunks, all of them
	// finished: a chunk had a finish_reason. Only then is the stream's end
	// (with [DONE] or without: some servers close after the last chunk) a
	// clean one; before it, the stream was cut.
	finished bool
	fixed    []byte // a usage chunk given "choices":[]
	key      string // the engine's API key, kept out of error messages
	model    modelName
	// includeUsage: the client asked for a usage chunk (stream_options).
	// Usage the server sends otherwise is counted, not passed on; usage on a
	// chunk of choices is split off (schemas.SplitUsage). usageAsSent: the
	// client asked vLLM for usage on every chunk (continuous_usage_stats),
	// so usage goes through as the server sends it.
	includeUsage, usageAsSent bool
}

// run reads lines until the stream's end, a read error, a mid-stream error
// object (*schemas.Error) or a sink error (*sinkError). The end is errDone
// after a finish_reason ([DONE] or the body's end), else a 502
// engine_stream_truncated. Lines read before any of these reach the sink
// first.
func (s *sseState) run(br *bufio.Reader, sink engine.Sink) error {
	for {
		line, rerr := s.readLine(br)
		if data, ok := dataOf(line, rerr); ok {
			if bytes.Equal(data, done) {
				return s.flush(sink, s.end("[DONE] came"))
			}
			if errorFirst(data) && isErrorChunk(data) {
				return s.flush(sink, scrubKey(UpstreamError(0, data), s.key))
			}
			s.chunks++
			data = s.model.fix(data)
			if !s.finished && hasFinish(data) {
				s.finished = true
			}
			withUsage := hasUsage(data)
			if withUsage && !s.usageAsSent {
				if c, u, ok := schemas.SplitUsage(data); ok {
					// Usage on a chunk of choices (transformers serve's last
					// chunk, sent whether asked or not): OpenAI's two chunks,
					// the usage one only if the client asked for it.
					s.last = append(s.last[:0], u...)
					s.counted++
					s.add(c)
					if s.includeUsage {
						s.add(u)
					}
					goto next
				}
				if !s.includeUsage {
					// A usage chunk nobody asked for: kept for the count, not sent.
					s.last = append(s.last[:0], data...)
					goto next
				}
			}
			if withUsage {
				if quoted(data, []byte(`choices"`)) < 0 {
					// A usage chunk without "choices" (some servers): OpenAI's
					// has "choices":[], and clients read the key.
					s.fixed = withEmptyChoices(s.fixed[:0], data)
					data = s.fixed
				}
				s.last = append(s.last[:0], data...)
			} else {
				s.counted++
			}
			s.add(data)
		}
	next:
		if rerr != nil {
			if rerr == io.EOF {
				if len(bytes.TrimSpace(line)) == 0 {
					return s.flush(sink, s.end("the body ended"))
				}
				rerr = io.ErrUnexpectedEOF // a line cut short
			}
			return s.flush(sink, rerr)
		}
		if len(s.batch) > 0 && (len(s.batch) >= maxBatch || !lineReady(br)) {
			if err := s.flush(sink, nil); err != nil {
				return err
			}
		}
	}
}

// add puts a chunk in the batch for the sink.
func (s *sseState) add(data []byte) {
	if len(s.batch) > 0 {
		s.batch = append(s.batch, '\n')
	}
	s.batch = append(s.batch, data...)
}

// end is how a stream that ends now (how says why) ends: cleanly after a
// finish_reason, else truncated; a stream with no chunk at all says so (a
// server that refused the request without an error, as some do with a
// prompt over the context).
func (s *sseState) end(how string) error {
	switch {
	case s.finished:
		return errDone
	case s.chunks == 0:
		return schemas.ErrEngineTruncated.New(how + " with no chunk at all: the engine answered 200 with an empty stream")
	}
	return schemas.ErrEngineTruncated.New(fmt.Sprintf("%s after %d chunks, before any finish_reason", how, s.chunks))
}

// flush hands the batch to the sink, then returns then (or the sink's error).
func (s *sseState) flush(sink engine.Sink, then error) error {
	if len(s.batch) > 0 {
		err := sink.Chunks(s.batch)
		s.batch = s.batch[:0]
		if err != nil {
			return &sinkError{err}
		}
	}
	return then
}

// usage is the stream's usage: the last usage chunk's, or the estimate
// (estimated true) of one completion token per chunk.
func (s *sseState) usage() (u schemas.Usage, estimated bool) {
	if s.last != nil {
		if u := schemas.UsageOf(s.last); u != nil {
			return *u, false
		}
	}
	return schemas.Usage{CompletionTokens: s.counted, TotalTokens: s.counted}, true
}

// readLine reads one line, '\n' included; a partial line comes with the
// read error.
func (s *sseState) readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		return line, err
	}
	s.long = append(s.long[:0], line...)
	for {
		line, err = br.ReadSlice('\n')
		s.long = append(s.long, line...)
		if len(s.long) > s.maxLine {
			return nil, engineError("an SSE line from the engine is longer than %d bytes", s.maxLine)
		}
		if err != bufio.ErrBufferFull {
			return s.long, err
		}
	}
}

var (
	dataPrefix = []byte("data:")
	done       = []byte("[DONE]")
)

// dataOf returns the payload of a complete "data:" line. Blank lines,
// comments and other fields (event:, id:, retry:) are skipped.
func dataOf(line []byte, err error) ([]byte, bool) {
	if err != nil || !bytes.HasPrefix(line, dataPrefix) {
		return nil, false
	}
	d := line[len(dataPrefix):]
	d = bytes.TrimSuffix(d, []byte{'\n'})
	d = bytes.TrimSuffix(d, []byte{'\r'})
	if len(d) > 0 && d[0] == ' ' {
		d = d[1:]
	}
	return d, len(d) > 0
}

// lineReady reports whether a whole line is already in br's buffer, so
// reading it will not wait for the network.
func lineReady(br *bufio.Reader) bool {
	n := br.Buffered()
	if n == 0 {
		return false
	}
	b, _ := br.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// errorFirst is the cheap test, before any JSON decoding, for a mid-stream
// error object: servers send it alone, {"error": {...}} (vLLM, SGLang,
// OpenAI) or {"error": "...", ...} (TGI), so its first key is "error".
func errorFirst(d []byte) bool {
	i := skipSpace(d, 0)
	if i == len(d) || d[i] != '{' {
		return false
	}
	return bytes.HasPrefix(d[skipSpace(d, i+1):], []byte(`"error"`))
}

// skipSpace is the index of the first byte of d from i on that is not JSON
// whitespace. (bytes.TrimLeft with a cutset builds a set on every call: a
// few percent of the worker's CPU per token.)
func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\r' || d[i] == '\n') {
		i++
	}
	return i
}

// hasUsage is the cheap test for a chunk with a usage object ("usage", ':',
// '{'). The pattern starts after the quote, so bytes.Index skips ahead on
// the rarer 'u', not on '"'.
func hasUsage(d []byte) bool {
	for {
		i := quoted(d, []byte(`usage"`))
		if i < 0 {
			return false
		}
		d = d[i+len(`usage"`):]
		if j := skipSpace(d, 0); j < len(d) && d[j] == ':' {
			if j = skipSpace(d, j+1); j < len(d) && d[j] == '{' {
				return true
			}
		}
	}
}

// withEmptyChoices appends to dst the chunk d with "choices":[] as its
// first member.
func withEmptyChoices(dst, d []byte) []byte {
	i := bytes.IndexByte(d, '{')
	if i < 0 {
		return append(dst, d...)
	}
	dst = append(dst, d[:i+1]...)
	dst = append(dst, `"choices":[]`...)
	if rest := bytes.TrimSpace(d[i+1:]); len(rest) > 0 && rest[0] != '}' {
		dst = append(dst, ',')
	}
	return append(dst, d[i+1:]...)
}

// hasFinish is the cheap test for a choice with a finish_reason that is a
// string (finish_reason, ':', '"'), not null.
func hasFinish(d []byte) bool {
	for {
		i := quoted(d, []byte(`finish_reason"`))
		if i < 0 {
			return false
		}
		d = d[i+len(`finish_reason"`):]
		if j := skipSpace(d, 0); j < len(d) && d[j] == ':' {
			if j = skipSpace(d, j+1); j < len(d) && d[j] == '"' {
				return true
			}
		}
	}
}

// quoted finds pat preceded by '"' in d.
func quoted(d, pat []byte) int {
	off := 0
	for {
		i := bytes.Index(d[off:], pat)
		if i < 0 {
			return -1
		}
		if off+i > 0 && d[off+i-1] == '"' {
			return off + i
		}
		off += i + 1
	}
}

// isErrorChunk tells an error object from a chunk with "error": null.
func isErrorChunk(d []byte) bool {
	var c schemas.Chunk
	if schemas.ReadChunk(d, &c) != nil {
		return false
	}
	return len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null"))
}

// activityReader notes on its idle timer when bytes arrive.
type activityReader struct {
	r    io.Reader
	idle *idleTimer
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.idle.touch()
	}
	return n, err
}

// idleTimer calls fire after d without activity. Activity only records a
// time; the timer is re-armed when it fires early, instead of being reset on
// every read (one per token), which cost two timer-heap operations each.
type idleTimer struct {
	d     time.Duration
	start time.Time
	last  atomic.Int64 // time since start of the last activity, in nanoseconds
	t     *time.Timer
}

func newIdleTimer(d time.Duration, fire func()) *idleTimer {
	it := &idleTimer{d: d, start: time.Now()}
	it.t = time.AfterFunc(time.Hour, func() {
		if idle := time.Since(it.start) - time.Duration(it.last.Load()); idle < it.d {
			it.t.Reset(it.d - idle)
			return
		}
		fire()
	})
	it.t.Reset(d) // armed once it.t is set: the callback uses it
	return it
}

func (it *idleTimer) touch() { it.last.Store(int64(time.Since(it.start))) }

func (it *idleTimer) stop() { it.t.Stop() }

func isEventStream(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

func engineError(format string, args ...any) *schemas.Error {
	return schemas.ErrEngine.New(fmt.Sprintf(format, args...))
}

func errStalled(d time.Duration) *schemas.Error {
	return engineError("the engine sent nothing for %s", d)
}

func errSlow(d time.Duration) *schemas.Error {
	return engineError("the engine did not answer within %s", d)
}

// failure turns a transport or read error into what Generate returns: the
// caller's own context error, the cause we cancelled with (stall, abort,
// close), else a 503 before the answer started or a 502 after.
func (e *Engine) failure(ctx, rctx context.Context, err error, started bool) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if rctx.Err() != nil {
		if se := (*schemas.Error)(nil); errors.As(context.Cause(rctx), &se) {
			return se
		}
	}
	if started {
		return engineError("the connection to the engine broke: %v", err)
	}
	return schemas.ErrEngineUnhealthy.New(e.name, e.base, "unreachable: "+err.Error())
}

// boundView is the worker's reading of the body (or, when called directly,
// a reading of its own by the same reader), checked against req.Model: a
// body naming another model is model_mismatch.
func boundView(req *engine.Request) (*schemas.Request, error) {
	v := req.View
	if v == nil {
		var err *schemas.Error
		if v, err = schemas.ReadRequestFor(req.Kind, req.Body, req.Model); err != nil {
			return nil, err
		}
	}
	if req.Model != "" && v.Model != req.Model {
		return nil, schemas.ErrModelMismatch.New(req.Model, `the body's "model"`, v.Model)
	}
	return v, nil
}
