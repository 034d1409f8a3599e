package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// Quirk is one way a real OpenAI-compatible server differs from vLLM. A
// quirk fake (QuirkServer) is the sim-server with that one difference, so
// that the suite, run against it, shows the engine copes with it.
type Quirk string

const (
	// QuirkNoDone: streams end after the last chunk without data: [DONE]
	// (transformers serve).
	QuirkNoDone Quirk = "no [DONE]"
	// QuirkStrict: a request field outside OpenAI's API (ignore_eos,
	// x_...) is answered 422 with FastAPI's detail list (transformers
	// serve), which also has no /v1/embeddings, /tokenize, /detokenize.
	// Its harness lacks Extensions and Pooling; the sim behind it never stops
	// by itself, so max_tokens are all generated without ignore_eos.
	QuirkStrict Quirk = "strict fields"
	// QuirkMinimalModels: GET /v1/models lists {"id"} and nothing else.
	QuirkMinimalModels Quirk = "minimal /v1/models"
	// QuirkUsageApart: the usage chunk has no "choices" key at all, only
	// id, object, model and usage.
	QuirkUsageApart Quirk = "usage apart"
	// QuirkSlowFirstByte: response headers come only after a pause (a
	// server that prefills before it answers).
	QuirkSlowFirstByte Quirk = "slow first byte"
	// QuirkUUIDOnly: an X-Request-Id that is not a UUID is answered 400
	// with an empty body (a popular CPU server).
	QuirkUUIDOnly Quirk = "UUID-only request ids"
	// QuirkOneAtATime: the server runs one request at a time, and any
	// request that arrives (GET /v1/models and /health included) ends the
	// running stream with data: [DONE] and no finish_reason (a popular CPU
	// server). Its harness lacks Concurrency; an engine in front of it must
	// never probe or refresh while a request runs, and must take a stream
	// cut so for an error, never a finished one.
	QuirkOneAtATime Quirk = "one request at a time"
	// QuirkNoHealth: no /health and no /metrics (404), as any
	// OpenAI-compatible server that is not vLLM.
	QuirkNoHealth Quirk = "no /health"
	// QuirkOwnModelName: answers name the model as the server calls it
	// ("<model>@main"), not as the request did (transformers serve).
	QuirkOwnModelName Quirk = "own model name"
	// QuirkUsageOnLast: a stream's usage comes on its last chunk of
	// choices, whether the client asked for it or not (transformers serve).
	QuirkUsageOnLast Quirk = "usage on the last chunk"
)

// Quirks are the quirk fakes, in order.
var Quirks = []Quirk{QuirkNoDone, QuirkStrict, QuirkMinimalModels, QuirkUsageApart, QuirkSlowFirstByte, QuirkUUIDOnly,
	QuirkOneAtATime, QuirkNoHealth, QuirkOwnModelName, QuirkUsageOnLast}

// slowFirstByte is QuirkSlowFirstByte's pause.
const slowFirstByte = 150 * time.Millisecond

// QuirkServer serves SimServer's sim engine of sc, with quirk q, on a
// loopback port and returns its root URL. Both stop with the test.
func QuirkServer(t testing.TB, sc sim.Config, cfg simserver.Config, q Quirk) string {
	t.Helper()
	if q == QuirkStrict {
		sc.MinEOS, sc.MaxEOS = 1<<30, 1<<30 // no natural end: max_tokens without ignore_eos
	}
	eng, err := sim.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	inner := simserver.New(cfg, eng, nil)
	one := &oneAtATime{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q == QuirkOneAtATime {
			one.serve(w, r, inner)
			return
		}
		serveQuirk(w, r, q, inner, sc.Model)
	}))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		eng.Close()
	})
	return hs.URL
}

func serveQuirk(w http.ResponseWriter, r *http.Request, q Quirk, inner http.Handler, model string) {
	generation := r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && strings.HasSuffix(r.URL.Path, "completions")
	switch q {
	case QuirkNoDone:
		if generation {
			w = &eventFilter{ResponseWriter: w, edit: func(ev []byte) []byte {
				if bytes.HasPrefix(ev, []byte("data: [DONE]")) {
					return nil
				}
				return ev
			}}
		}
	case QuirkStrict:
		switch r.URL.Path {
		case "/v1/embeddings", "/tokenize", "/detokenize": // transformers serve has none of them
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"detail":"Not Found"}`)
			return
		}
		if generation {
			body, _ := io.ReadAll(r.Body)
			if field := unknownField(body); field != "" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnprocessableEntity)
				fmt.Fprintf(w, `{"detail":[{"type":"extra_forbidden","loc":["body",%q],"msg":"Extra inputs are not permitted","input":true}]}`, field)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
	case QuirkMinimalModels:
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			fmt.Fprintf(w, `{"data":[{"id":%q}]}`, model)
			return
		}
	case QuirkUsageApart:
		if generation {
			w = &eventFilter{ResponseWriter: w, edit: func(ev []byte) []byte {
				return bytes.Replace(ev, []byte(`"choices":[],`), nil, 1)
			}}
		}
	case QuirkSlowFirstByte:
		if generation {
			select {
			case <-time.After(slowFirstByte):
			case <-r.Context().Done():
				return
			}
		}
	case QuirkOwnModelName:
		if generation {
			from, to := []byte(fmt.Sprintf(`"model":%q`, model)), []byte(fmt.Sprintf(`"model":%q`, model+"@main"))
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"stream":true`)) {
				w = &eventFilter{ResponseWriter: w, edit: func(ev []byte) []byte { return bytes.Replace(ev, from, to, 1) }}
				break
			}
			rec := httptest.NewRecorder()
			inner.ServeHTTP(rec, r)
			maps.Copy(w.Header(), rec.Header())
			out := bytes.Replace(rec.Body.Bytes(), from, to, 1)
			w.Header().Set("Content-Length", strconv.Itoa(len(out)))
			w.WriteHeader(rec.Code)
			_, _ = w.Write(out)
			return
		}
	case QuirkUsageOnLast:
		if generation {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"stream":true`)) && !bytes.Contains(body, []byte(`"stream_options"`)) {
				body = append([]byte(`{"stream_options":{"include_usage":true},`), bytes.TrimPrefix(bytes.TrimSpace(body), []byte("{"))...)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var held [][]byte // the chunks with a finish_reason, waiting for the usage
			w = &eventFilter{ResponseWriter: w, edit: func(ev []byte) []byte {
				switch {
				case bytes.Contains(ev, []byte(`"finish_reason":"`)):
					held = append(held, bytes.Clone(ev))
					return nil
				case bytes.Contains(ev, []byte(`"usage":{`)) && len(held) > 0:
					// the usage object, moved onto the last held chunk
					u := ev[bytes.Index(ev, []byte(`"usage":{`)):]
					u = u[:bytes.LastIndexByte(u, '}')]
					last := held[len(held)-1]
					end := bytes.LastIndexByte(last, '}')
					merged := append(bytes.Clone(last[:end]), ',')
					merged = append(merged, u...)
					held[len(held)-1] = append(merged, last[end:]...)
				}
				out := bytes.Join(held, nil)
				held = nil
				if bytes.Contains(ev, []byte(`"usage":{`)) {
					return out
				}
				return append(out, ev...)
			}}
		}
	case QuirkNoHealth:
		if r.URL.Path == "/health" || r.URL.Path == "/metrics" {
			http.NotFound(w, r)
			return
		}
	case QuirkUUIDOnly:
		if id := r.Header.Get("X-Request-Id"); id != "" && !uuidRE.MatchString(id) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
	}
	inner.ServeHTTP(w, r)
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// oneAtATime is QuirkOneAtATime's state: the running generation's cut.
type oneAtATime struct {
	mu  sync.Mutex
	cut func() // ends the running generation; nil when none runs
}

// serve cuts the running generation, then serves r; a generation that is cut
// in its turn stops at an event's end and sends data: [DONE].
func (o *oneAtATime) serve(w http.ResponseWriter, r *http.Request, inner http.Handler) {
	o.mu.Lock()
	if o.cut != nil {
		o.cut()
		o.cut = nil
	}
	generation := r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && strings.HasSuffix(r.URL.Path, "completions")
	if !generation {
		o.mu.Unlock()
		inner.ServeHTTP(w, r)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	var cut atomic.Bool
	o.cut = func() { cut.Store(true); cancel() }
	o.mu.Unlock()
	defer cancel()
	f := &eventFilter{ResponseWriter: w, edit: func(ev []byte) []byte {
		if cut.Load() || bytes.HasPrefix(ev, []byte("data: [DONE]")) {
			return nil
		}
		return ev
	}}
	inner.ServeHTTP(f, r.WithContext(ctx))
	if cut.Load() || strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		// cut or not, the stream ends with [DONE]; a cut one has no finish_reason
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// openAIFields are the request fields of OpenAI's chat and completions
// APIs: what QuirkStrict accepts.
var openAIFields = map[string]bool{
	"model": true, "messages": true, "prompt": true, "stream": true, "stream_options": true, "max_tokens": true,
	"max_completion_tokens": true, "n": true, "stop": true, "temperature": true, "top_p": true, "seed": true,
	"frequency_penalty": true, "presence_penalty": true, "logit_bias": true, "logprobs": true, "top_logprobs": true,
	"user": true, "tools": true, "tool_choice": true, "parallel_tool_calls": true, "response_format": true,
	"echo": true, "suffix": true, "best_of": true,
}

// unknownField is the first top-level field of body outside openAIFields
// ("" if none, or if body is not an object: the server behind judges it).
func unknownField(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := tok.(string)
		if !openAIFields[key] {
			return key
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}

// eventFilter rewrites a text/event-stream body event by event (edit gets
// each event, its blank line included, and returns what to send; nil drops
// it). A non-stream body passes through.
type eventFilter struct {
	http.ResponseWriter
	edit    func([]byte) []byte
	pending []byte
}

func (f *eventFilter) Write(p []byte) (int, error) {
	if !strings.HasPrefix(f.Header().Get("Content-Type"), "text/event-stream") {
		return f.ResponseWriter.Write(p)
	}
	f.pending = append(f.pending, p...)
	for {
		i := bytes.Index(f.pending, []byte("\n\n"))
		if i < 0 {
			return len(p), nil
		}
		ev := f.edit(f.pending[:i+2])
		if _, err := f.ResponseWriter.Write(ev); err != nil {
			return 0, err
		}
		f.pending = f.pending[i+2:]
	}
}

func (f *eventFilter) Flush() {
	if fl, ok := f.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}
