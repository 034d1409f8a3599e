package bench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
)

// fakeOpts configures the target the bench runs against: the fake vLLM
// (internal/fakevllm), scripted for every request (the bench adds no x_fake
// to its bodies), behind a gate the test holds.
type fakeOpts struct {
	ttft    time.Duration // delay before the first content chunk
	itl     time.Duration // delay after each content chunk
	mode    string        // a fakevllm mode for every request, e.g. "nodone"
	status  int           // a non-200 status with an OpenAI error body
	hold    chan struct{} // if set, every request waits here before it is served
	arrived chan struct{} // if set, gets a value (non-blocking) per request
	name    string        // with order: appended to order on every request
	order   *orderLog
}

// orderLog records which server saw each request, across servers.
type orderLog struct {
	mu  sync.Mutex
	seq []string
}

func (o *orderLog) add(s string) {
	o.mu.Lock()
	o.seq = append(o.seq, s)
	o.mu.Unlock()
}

func (o *orderLog) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.seq)
}

// fakeServer is the fake vLLM, serving any model, which streams or returns
// max_tokens tokens per request.
type fakeServer struct {
	*httptest.Server
	fake *fakevllm.Server
}

func newFakeServer(t testing.TB, o fakeOpts) *fakeServer {
	f := fakevllm.New()
	f.AnyModel = true
	f.Default = fakevllm.Script{Mode: o.mode, TTFTMS: int(o.ttft / time.Millisecond), DelayMS: int(o.itl / time.Millisecond)}
	if o.status != 0 {
		f.Default.Mode, f.Default.Status = "error_nested", o.status
	}
	fs := &fakeServer{fake: f}
	fs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "completions") {
			if o.order != nil {
				o.order.add(o.name)
			}
			if o.arrived != nil {
				select {
				case o.arrived <- struct{}{}:
				default:
				}
			}
			if o.hold != nil {
				select {
				case <-o.hold:
				case <-r.Context().Done():
					return
				}
			}
		}
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(fs.Close)
	return fs
}

func (fs *fakeServer) URL() string { return fs.Server.URL + "/v1" }

// seen returns the prompts (a completion's prompt, a chat's messages as
// JSON) and decoded bodies received so far, in arrival order.
func (fs *fakeServer) seen() ([]string, []map[string]any) {
	var prompts []string
	var bodies []map[string]any
	for _, r := range fs.fake.Received() {
		var req struct {
			Prompt   string          `json:"prompt"`
			Messages json.RawMessage `json:"messages"`
		}
		var raw map[string]any
		_ = json.Unmarshal(r.Body, &req)
		_ = json.Unmarshal(r.Body, &raw)
		if strings.HasSuffix(r.Path, "/chat/completions") {
			prompts = append(prompts, string(req.Messages))
		} else {
			prompts = append(prompts, req.Prompt)
		}
		bodies = append(bodies, raw)
	}
	return prompts, bodies
}

// defectServer is a purpose-built OpenAI-compatible streaming server for
// the stream verification tests and the client benchmark, not the fake
// vLLM: it breaks the protocol in ways a fake engine should not (see
// stream), and writes its stream with no work of its own, so the
// benchmark measures the bench's client.
type defectServer struct {
	*httptest.Server
	defect string // see stream
	perTok int    // tokens per content chunk (default 1)
	status int    // a non-200 status with an OpenAI error body
}

func newDefectServer(t testing.TB, d defectServer) *defectServer {
	ds := &d
	ds.Server = httptest.NewServer(http.HandlerFunc(ds.handle))
	t.Cleanup(ds.Close)
	return ds
}

func (ds *defectServer) URL() string { return ds.Server.URL + "/v1" }

func (ds *defectServer) handle(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model         string `json:"model"`
		MaxTokens     int    `json:"max_tokens"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		httpError(w, 400, "bad json")
		return
	}
	chat := strings.HasSuffix(r.URL.Path, "/v1/chat/completions")
	if !chat && !strings.HasSuffix(r.URL.Path, "/v1/completions") {
		httpError(w, 404, "no route "+r.URL.Path)
		return
	}
	if ds.status != 0 {
		httpError(w, ds.status, "model overloaded")
		return
	}
	n := req.MaxTokens
	if n <= 0 {
		n = 16
	}
	ds.stream(w, r, chat, req.Model, n, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
}

func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error","param":null,"code":null}}`, msg)
}

// stream writes an SSE response. Defects: no_done, two_ids, error_chunk,
// error_null, no_finish, no_usage, bad_index, comment_line, data_after_done,
// bad_json, wrong_ct, no_id, double_finish, linger.
func (ds *defectServer) stream(w http.ResponseWriter, r *http.Request, chat bool, model string, n int, includeUsage bool) {
	defect := ds.defect
	fl := w.(http.Flusher)
	if defect == "wrong_ct" {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "text/event-stream")
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	id, object := "cmpl-1", "text_completion"
	if chat {
		id, object = "chatcmpl-1", "chat.completion.chunk"
	}
	send := func(s string) bool {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", s); err != nil {
			return false
		}
		fl.Flush()
		return true
	}
	piece := func(cid, content, finish string, index int) string {
		fr := "null"
		if finish != "" {
			fr = fmt.Sprintf("%q", finish)
		}
		idField := fmt.Sprintf(`"id":%q,`, cid)
		if defect == "no_id" {
			idField = ""
		}
		if chat {
			return fmt.Sprintf(`{%s"object":%q,"created":1,"model":%q,"choices":[{"index":%d,"delta":{"content":%q},"logprobs":null,"finish_reason":%s}]}`, idField, object, model, index, content, fr)
		}
		return fmt.Sprintf(`{%s"object":%q,"created":1,"model":%q,"choices":[{"index":%d,"text":%q,"logprobs":null,"finish_reason":%s}]}`, idField, object, model, index, content, fr)
	}
	if chat {
		send(fmt.Sprintf(`{"id":%q,"object":%q,"created":1,"model":%q,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`, id, object, model))
	}
	if defect == "comment_line" {
		fmt.Fprint(w, ": ping\n\n")
	}
	per := max(ds.perTok, 1)
	for i := 0; i < n; i += per {
		cid, index := id, 0
		if defect == "two_ids" && i > 0 {
			cid = id + "-other"
		}
		if defect == "bad_index" {
			index = 1
		}
		k := min(per, n-i)
		if !send(piece(cid, strings.Repeat(" tok", k), "", index)) {
			return
		}
		if defect == "error_chunk" && i == 0 {
			send(`{"error":{"message":"engine died","type":"internal_error","param":null,"code":500}}`)
			send("[DONE]")
			return
		}
		if defect == "bad_json" && i == 0 {
			send(`{"id":` + id)
		}
	}
	switch defect {
	case "no_finish":
	case "double_finish":
		send(piece(id, "", "length", 0))
		send(piece(id, "", "length", 0))
	default:
		send(piece(id, "", "length", 0))
	}
	if includeUsage && defect != "no_usage" {
		errField := ""
		if defect == "error_null" {
			errField = `,"error":null`
		}
		send(fmt.Sprintf(`{"id":%q,"object":%q,"created":1,"model":%q,"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}%s}`, id, object, model, n, n+10, errField))
	}
	if defect == "no_done" {
		return
	}
	send("[DONE]")
	switch defect {
	case "data_after_done":
		send(piece(id, "late", "", 0))
	case "linger":
		<-r.Context().Done()
	}
}
