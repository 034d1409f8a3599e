package simserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

var (
	errSlowClient = errors.New("simserver: the client reads the stream too slowly")
	errNotStream  = errors.New("simserver: the engine streamed a request the server did not see as a stream")
)

// jsonContent answers 415 unless the body is application/json (vLLM's test:
// the media type before any ';', lower-cased).
func (s *Server) jsonContent(w http.ResponseWriter, r *http.Request) bool {
	mt, _, _ := strings.Cut(strings.ToLower(r.Header.Get("Content-Type")), ";")
	if mt == "application/json" {
		return true
	}
	s.writeError(w, newError(http.StatusUnsupportedMediaType, "", "Unsupported Media Type: Only 'application/json' is allowed"))
	return false
}

// readBody reads the body into a pooled buffer (give it back with putBody).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (*[]byte, bool) {
	tooLarge := func() (*[]byte, bool) {
		s.writeError(w, newError(http.StatusRequestEntityTooLarge, "", "the request body is larger than the server accepts"))
		return nil, false
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return tooLarge()
	}
	bp, _ := s.bodies.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	b := (*bp)[:0]
	if r.ContentLength > 0 && int64(cap(b)) <= r.ContentLength {
		b = make([]byte, 0, r.ContentLength+512) // room to read the EOF without growing
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > s.cfg.MaxBodyBytes {
			*bp = b[:0]
			s.putBody(bp)
			return tooLarge()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			*bp = b[:0]
			s.putBody(bp)
			s.writeError(w, newError(http.StatusBadRequest, "", "reading the request body: "+err.Error()))
			return nil, false
		}
	}
	*bp = b
	return bp, true
}

func (s *Server) putBody(bp *[]byte) {
	if cap(*bp) <= 1<<20 {
		*bp = (*bp)[:0]
		s.bodies.Put(bp)
	}
}

// serveGenerate is POST /v1/chat/completions and /v1/completions.
func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	start := time.Now()
	if !s.jsonContent(w, r) {
		return
	}
	bp, ok := s.readBody(w, r)
	if !ok {
		return
	}
	defer s.putBody(bp)
	kind := schemas.KindCompletion
	if chat {
		kind = schemas.KindChat
	}
	// Read once, with the reader every part of tokenbus uses; the engine
	// decides on this view. vLLM's "model" is optional: the base model.
	view, rerr := schemas.ReadRequest(kind, *bp, s.model)
	if rerr != nil {
		s.writeError(w, fromError(rerr))
		return
	}
	model, stream := view.Model, view.Stream
	req := engine.Request{ID: r.Header.Get("X-Request-Id"), Kind: kind, Model: model, Body: *bp, View: view}
	adapter := ""
	if model != "" && !s.base[model] {
		adapter = model
	}
	if stream {
		s.serveStream(w, r, &req, adapter, start)
	} else {
		s.serveWhole(w, r, &req, adapter, start)
	}
}

// serveWhole answers a stream:false request with the whole response.
func (s *Server) serveWhole(w http.ResponseWriter, r *http.Request, req *engine.Request, adapter string, start time.Time) {
	s.loraBegin(adapter, true)
	res, err := s.eng.Generate(r.Context(), req, noStream{})
	s.loraEnd(adapter, true)
	if err != nil {
		if r.Context().Err() == nil {
			s.writeError(w, fromError(err))
		}
		return
	}
	s.e2e.Observe(time.Since(start).Seconds())
	writeRaw(w, http.StatusOK, "application/json", res.Response)
}

// noStream is the sink of a stream:false request: the sim never calls it.
type noStream struct{}

func (noStream) Chunks([]byte) error { return errNotStream }

type genResult struct {
	res *engine.Result
	err error
}

// streamSink is the sink of a streaming request: see the package comment.
type streamSink struct {
	s       *Server
	adapter string
	start   time.Time
	ready   chan struct{}  // capacity 1: pending has news (or the request was accepted)
	done    chan genResult // Generate's result
	out     []byte         // the writer's buffer between requests

	mu       sync.Mutex
	pending  []byte // SSE events not yet written
	accepted bool
	running  bool      // a chunk came
	last     time.Time // when the last chunk came
	err      error     // set: Chunks fails (the client is gone or too slow)
}

func (s *Server) getSink() *streamSink {
	k, _ := s.sinks.Get().(*streamSink)
	if k == nil {
		k = &streamSink{s: s, ready: make(chan struct{}, 1), done: make(chan genResult, 1)}
	}
	return k
}

func (s *Server) putSink(k *streamSink) {
	select {
	case <-k.ready:
	default:
	}
	k.adapter, k.accepted, k.running, k.err = "", false, false, nil
	if cap(k.pending) > 1<<20 {
		k.pending = nil
	}
	if cap(k.out) > 1<<20 {
		k.out = nil
	}
	k.pending, k.out = k.pending[:0], k.out[:0]
	s.sinks.Put(k)
}

func (k *streamSink) signal() {
	select {
	case k.ready <- struct{}{}:
	default:
	}
}

// Accepted is sim.Accepter: the headers can go.
func (k *streamSink) Accepted() {
	k.mu.Lock()
	k.accepted = true
	k.mu.Unlock()
	k.signal()
}

var _ sim.Accepter = (*streamSink)(nil)

// Chunks turns each '\n'-separated chunk into an SSE event for the writer.
func (k *streamSink) Chunks(b []byte) error {
	now := time.Now()
	k.mu.Lock()
	if k.err != nil {
		err := k.err
		k.mu.Unlock()
		return err
	}
	first, prev := !k.running, k.last
	k.running, k.last = true, now
	p := k.pending
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) > 0 {
			p = append(p, "data: "...)
			p = append(p, line...)
			p = append(p, "\n\n"...)
		}
	}
	k.pending = p
	var err error
	if len(p) > k.s.cfg.MaxPendingBytes {
		k.err, err = errSlowClient, errSlowClient
	}
	k.mu.Unlock()
	if first {
		k.s.ttft.Observe(now.Sub(k.start).Seconds())
		k.s.loraRunning(k.adapter)
	} else {
		k.s.itl.Observe(now.Sub(prev).Seconds())
	}
	k.signal()
	return err
}

// swap takes the pending events, leaving spare (emptied) in their place.
func (k *streamSink) swap(spare []byte) []byte {
	k.mu.Lock()
	out := k.pending
	k.pending = spare[:0]
	k.mu.Unlock()
	return out
}

func (k *streamSink) fail(err error) {
	k.mu.Lock()
	if k.err == nil {
		k.err = err
	}
	k.mu.Unlock()
}

func (k *streamSink) state() (accepted, running bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.accepted, k.running, k.err
}

// streamWriteTimeout bounds a write of a stream to a client that stopped reading.
const streamWriteTimeout = 30 * time.Second

var (
	doneEvent = []byte("data: [DONE]\n\n")
	sseType   = []string{"text/event-stream; charset=utf-8"}
)

// serveStream answers a stream:true request with server-sent events.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, req *engine.Request, adapter string, start time.Time) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	k := s.getSink()
	defer s.putSink(k)
	k.adapter, k.start = adapter, start
	s.loraBegin(adapter, false)
	go func() {
		res, err := s.eng.Generate(ctx, req, k)
		k.done <- genResult{res, err}
	}()

	rc := http.NewResponseController(w)
	out := k.out
	headers, broken := false, false
	var deadline time.Time                                  // of writes; moved on every few seconds, not per write
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }() // the connection may serve another request
	write := func(b []byte) {
		if now := time.Now(); deadline.Sub(now) < streamWriteTimeout/2 {
			deadline = now.Add(streamWriteTimeout)
			_ = rc.SetWriteDeadline(deadline) // a client that reads nothing does not hold the handler forever
		}
		if !headers {
			headers = true
			w.Header()["Content-Type"] = sseType
			w.WriteHeader(http.StatusOK)
		}
		var err error
		if len(b) > 0 {
			_, err = w.Write(b)
		}
		if err == nil {
			err = rc.Flush()
			s.flushes.Add(1)
		}
		if err != nil {
			broken = true
			k.fail(err)
			cancel() // the sim aborts within a step
		}
	}
	var g genResult
wait:
	for {
		select {
		case <-k.ready:
			out = k.swap(out)
			if !broken {
				write(out)
			}
		case g = <-k.done:
			break wait
		}
	}
	accepted, running, _ := k.state()
	s.loraEnd(adapter, running)
	out = k.swap(out)
	k.out = out
	switch {
	case broken || r.Context().Err() != nil:
		// The client is gone: nothing to say.
	case g.err != nil && !accepted && !headers:
		s.writeError(w, fromError(g.err))
	case g.err != nil:
		// vLLM's mid-stream error: an error object, then [DONE].
		out = append(out, "data: "...)
		out = append(out, fromError(g.err).body(s.cfg.LegacyErrors)...)
		out = append(out, "\n\n"...)
		write(append(out, doneEvent...))
	default:
		s.e2e.Observe(time.Since(start).Seconds())
		write(append(out, doneEvent...))
	}
	if cap(out) > cap(k.out) {
		k.out = out
	}
}
