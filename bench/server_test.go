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
)

// fakeOpts configures the in-test OpenAI-compatible server.
type fakeOpts struct {
	ttft    time.Duration // delay before the first content chunk
	itl     time.Duration // delay between content chunks
	perTok  int           // tokens per content chunk (default 1)
	defect  string        // see fakeServer.stream
	status  int           // non-200 status with an OpenAI error body
	hold    chan struct{} // if set, every request waits here before streaming
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

// fakeServer is an OpenAI-compatible server for /v1/chat/completions and
// /v1/completions that streams max_tokens tokens.
type fakeServer struct {
	*httptest.Server
	opts fakeOpts

	mu      sync.Mutex
	prompts []string // prompt or messages of each request, in arrival order
	bodies  []map[string]any
}

func newFakeServer(t testing.TB, o fakeOpts) *fakeServer {
	fs := &fakeServer{opts: o}
	fs.Server = httptest.NewServer(http.HandlerFunc(fs.handle))
	t.Cleanup(fs.Close)
	return fs
}

func (fs *fakeServer) URL() string { return fs.Server.URL + "/v1" }

// seen returns the prompts and decoded bodies received so far.
func (fs *fakeServer) seen() ([]string, []map[string]any) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.prompts), slices.Clone(fs.bodies)
}

func (fs *fakeServer) handle(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model         string          `json:"model"`
		Prompt        string          `json:"prompt"`
		Messages      json.RawMessage `json:"messages"`
		MaxTokens     int             `json:"max_tokens"`
		Stream        bool            `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	var raw map[string]any
	dec := json.NewDecoder(r.Body)
	var body json.RawMessage
	if err := dec.Decode(&body); err != nil || json.Unmarshal(body, &req) != nil || json.Unmarshal(body, &raw) != nil {
		httpError(w, 400, "bad json")
		return
	}
	chat := strings.HasSuffix(r.URL.Path, "/v1/chat/completions")
	if !chat && !strings.HasSuffix(r.URL.Path, "/v1/completions") {
		httpError(w, 404, "no route "+r.URL.Path)
		return
	}
	fs.mu.Lock()
	if chat {
		fs.prompts = append(fs.prompts, string(req.Messages))
	} else {
		fs.prompts = append(fs.prompts, req.Prompt)
	}
	fs.bodies = append(fs.bodies, raw)
	fs.mu.Unlock()
	if fs.opts.order != nil {
		fs.opts.order.add(fs.opts.name)
	}
	if fs.opts.arrived != nil {
		select {
		case fs.opts.arrived <- struct{}{}:
		default:
		}
	}
	if fs.opts.hold != nil {
		select {
		case <-fs.opts.hold:
		case <-r.Context().Done():
			return
		}
	}
	if fs.opts.status != 0 {
		httpError(w, fs.opts.status, "model overloaded")
		return
	}
	n := req.MaxTokens
	if n <= 0 {
		n = 16
	}
	if !req.Stream {
		fs.whole(w, r, chat, req.Model, n)
		return
	}
	fs.stream(w, r, chat, req.Model, n, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
}

func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error","param":null,"code":null}}`, msg)
}

func (fs *fakeServer) whole(w http.ResponseWriter, r *http.Request, chat bool, model string, n int) {
	if !sleepCtx(r, fs.opts.ttft+time.Duration(n-1)*fs.opts.itl) {
		return
	}
	text := strings.TrimSpace(strings.Repeat(" tok", n))
	w.Header().Set("Content-Type", "application/json")
	if chat {
		fmt.Fprintf(w, `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`, model, text, n, n+10)
	} else {
		fmt.Fprintf(w, `{"id":"cmpl-x","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`, model, text, n, n+10)
	}
}

func sleepCtx(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// stream writes an SSE response. Defects: no_done, two_ids, error_chunk,
// error_null, no_finish, no_usage, bad_index, comment_line, data_after_done,
// bad_json, wrong_ct, no_id, double_finish, linger.
func (fs *fakeServer) stream(w http.ResponseWriter, r *http.Request, chat bool, model string, n int, includeUsage bool) {
	defect := fs.opts.defect
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
	per := max(fs.opts.perTok, 1)
	if !sleepCtx(r, fs.opts.ttft) {
		return
	}
	for i := 0; i < n; i += per {
		if i > 0 && !sleepCtx(r, fs.opts.itl) {
			return
		}
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
