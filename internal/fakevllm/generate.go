package fakevllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Script is the x_fake object: how the fake answers one request.
type Script struct {
	Mode    string `json:"mode"`
	Chunks  int    `json:"chunks"`   // content chunks per choice; default the request's max_tokens, else 3
	Status  int    `json:"status"`   // of the error modes; default 400
	DelayMS int    `json:"delay_ms"` // pause after each content chunk
	TTFTMS  int    `json:"ttft_ms"`  // pause before the first content chunk (stream:false: before the answer)
	// CutAfter ends the first stream of each request id after that many
	// content chunks, as "truncate" does (no finish_reason, the body ends):
	// an engine that cut the stream, which the next attempt of the same
	// request (a migration's continuation) is not cut by.
	CutAfter int `json:"cut_after"`
	// StopAt ends a choice with finish_reason "stop" at the content token
	// of that position (tokens.go: counted from the start of the context,
	// so a continuation stops where the run it continues would have), as a
	// model's end-of-sequence token does. 0: never.
	StopAt int `json:"stop_at"`
}

// complete is POST /v1/chat/completions and /v1/completions.
func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := s.record(r, body)

	kind := schemas.KindCompletion
	if r.URL.Path == "/v1/chat/completions" {
		kind = schemas.KindChat
	}
	// vLLM's "model" is optional: the first base model.
	view, rerr := schemas.ReadRequest(kind, body, s.Base[0])
	if rerr != nil {
		writeError(w, rerr.Status, "BadRequestError", rerr.Body.Message, rerr.Body.Param)
		return
	}
	f := s.Default
	var x struct {
		Fake           *Script `json:"x_fake"`
		ReturnTokenIDs bool    `json:"return_token_ids"`
	}
	if json.Unmarshal(body, &x) == nil && x.Fake != nil {
		f = *x.Fake
	}
	if f.Status == 0 {
		f.Status = 400
	}
	switch f.Mode {
	case "error_flat":
		writeJSON(w, f.Status, fmt.Sprintf(`{"object":"error","message":"flat %d","type":"BadRequestError","param":null,"code":%d}`, f.Status, f.Status))
		return
	case "error_nested":
		param := "temperature"
		writeError(w, f.Status, "BadRequestError", fmt.Sprintf("nested %d", f.Status), &param)
		return
	}
	if !s.AnyModel && !s.IsBase(view.Model) && !s.isLoaded(view.Model) {
		param := "model"
		writeError(w, 404, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", view.Model), &param)
		return
	}
	prefill, decode := transferRole(view.KVTransfer)
	if decode && !s.takeTransfer(w, view.KVTransfer) {
		return
	}
	a := answer{s: s, id: id, view: view, script: f, chunks: f.Chunks, ids: x.ReturnTokenIDs, prompt: promptTokens(view)}
	a.start = startAt(a.prompt)
	a.finish = `"length"`
	if f.StopAt > 0 && f.StopAt >= a.start && f.StopAt-a.start+1 <= a.chunks {
		a.chunks, a.finish = f.StopAt-a.start+1, `"stop"`
	}
	if f.CutAfter > 0 && s.cutOnce(id) {
		a.cut = f.CutAfter
	}
	if a.chunks <= 0 {
		a.chunks = view.MaxTokens
	}
	if a.chunks <= 0 {
		a.chunks = 3
	}
	a.chat = kind == schemas.KindChat
	if a.chat {
		a.prefix, a.object = "chatcmpl-", "chat.completion.chunk"
	} else {
		a.prefix, a.object = "cmpl-", "text_completion"
	}
	if view.Stream {
		a.stream(w, r)
	} else {
		if prefill {
			a.kvParams = s.prefillParams(r, a.prefix+id, len(a.prompt))
		}
		a.whole(w, r)
	}
}

// writeError writes an error in vLLM's nested shape (≥ 0.10.1).
func writeError(w http.ResponseWriter, status int, typ, msg string, param *string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": param, "code": status}})
	writeJSON(w, status, string(b))
}

// answer is one request's answer being written.
type answer struct {
	s      *Server
	id     string
	view   *schemas.Request
	script Script
	chunks int // content chunks per choice
	chat   bool
	prefix string // of the response id
	object string // of a chunk
	ids    bool   // return_token_ids
	prompt []int  // the prompt's ids (tokens.go)
	start  int    // the position of the first content token
	cut    int    // end the stream after this many content chunks (CutAfter)
	finish string // of the last content chunk: "length", or "stop" (StopAt)
	// kvParams are a prefill's answer's kv_transfer_params (disagg.go).
	kvParams string
}

func (a *answer) usage() string {
	n, p := a.chunks*a.view.N, len(a.prompt)
	return fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":2}}`, p, n, p+n)
}

// token is content token i's text.
func (a *answer) token(i int) string { return fmt.Sprintf(" tok%d", a.start+i) }

// tokenIDs is content token i's token_ids value.
func (a *answer) tokenIDs(i int) string {
	if !a.ids {
		return "null"
	}
	return fmt.Sprintf("[%d]", FirstTokenID+a.start+i)
}

// promptIDs is the prompt_token_ids value of a stream's first chunk.
func (a *answer) promptIDs() string {
	if !a.ids {
		return "null"
	}
	return idsJSON(a.prompt)
}

// cutOnce reports whether request id's stream is cut: the first time only.
func (s *Server) cutOnce(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut[id] {
		return false
	}
	if s.cut == nil {
		s.cut = map[string]bool{}
	}
	s.cut[id] = true
	return true
}

// whole answers stream:false with the whole response.
func (a *answer) whole(w http.ResponseWriter, r *http.Request) {
	if a.script.Mode == "slow" {
		<-r.Context().Done()
		a.s.cancelled(a.id)
		return
	}
	if !pause(r, time.Duration(a.script.TTFTMS)*time.Millisecond) {
		return
	}
	var text strings.Builder
	for i := range a.chunks {
		text.WriteString(a.token(i))
	}
	var choices []string
	for k := range a.view.N {
		if a.chat {
			choices = append(choices, fmt.Sprintf(`{"index":%d,"message":{"role":"assistant","content":%q},"logprobs":null,"finish_reason":"length"}`, k, text.String()))
		} else {
			choices = append(choices, fmt.Sprintf(`{"index":%d,"text":%q,"logprobs":null,"finish_reason":"length"}`, k, text.String()))
		}
	}
	object := "text_completion"
	if a.chat {
		object = "chat.completion"
	}
	params := ""
	if a.kvParams != "" {
		params = `,"kv_transfer_params":` + a.kvParams
	}
	writeJSON(w, 200, fmt.Sprintf(`{"id":"%s%s","object":%q,"created":1,"model":%q,"choices":[%s],"usage":%s,"x_extra":{"kept":true}%s}`,
		a.prefix, a.id, object, a.view.Model, strings.Join(choices, ","), a.usage(), params))
}

// stream answers stream:true with server-sent events.
func (a *answer) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	mode := a.script.Mode
	var pending bytes.Buffer
	send := func(data string, record bool) {
		if record {
			a.s.mu.Lock()
			a.s.sent[a.id] = append(a.s.sent[a.id], data)
			a.s.mu.Unlock()
		}
		pending.WriteString("data: " + data + "\n\n")
		if mode != "burst" {
			w.Write(pending.Bytes())
			pending.Reset()
			fl.Flush()
		}
	}
	if mode == "empty" {
		return // a 200 stream with no chunk (a real server's answer to a prompt over the context)
	}
	// The members and their order are vLLM's: a completions choice names
	// stop_reason, prompt_token_ids (the first chunk's, with
	// return_token_ids) and token_ids, null when not asked; a chat stream
	// has prompt_token_ids at the top of its first chunk, token_ids in its
	// content chunks, and stop_reason in its last.
	head := fmt.Sprintf(`{"id":"%s%s","object":%q,"created":1,"model":%q,"choices":[`, a.prefix, a.id, a.object, a.view.Model)
	if a.chat {
		for k := range a.view.N {
			send(head+fmt.Sprintf(`{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":%s}`, k, a.promptIDs()), true)
		}
	}
	sentPrompt := make([]bool, a.view.N)
	firstOf := func(k int) string {
		if a.chat || sentPrompt[k] {
			return "null"
		}
		sentPrompt[k] = true
		return a.promptIDs()
	}
	if mode == "slow" {
		if !a.chat {
			send(head+fmt.Sprintf(`{"index":0,"text":%q,"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":%s,"token_ids":%s}]}`,
				a.token(0), firstOf(0), a.tokenIDs(0)), true)
		}
		<-r.Context().Done()
		a.s.cancelled(a.id)
		return
	}
	if !pause(r, time.Duration(a.script.TTFTMS)*time.Millisecond) {
		return
	}
	// A stream that fails mid-generation never finishes its choices.
	unfinished := mode == "midstream_error" || mode == "break" || mode == "truncate" || mode == "truncate_done"
	for i := range a.chunks {
		if a.cut > 0 && i == a.cut {
			return // cut: the body ends without a finish_reason
		}
		finish := "null"
		if i == a.chunks-1 && !unfinished {
			finish = a.finish
		}
		for k := range a.view.N {
			switch {
			case a.chat && finish == "null":
				send(head+fmt.Sprintf(`{"index":%d,"delta":{"content":%q},"logprobs":null,"finish_reason":null,"token_ids":%s}]}`, k, a.token(i), a.tokenIDs(i)), true)
			case a.chat:
				send(head+fmt.Sprintf(`{"index":%d,"delta":{"content":%q},"logprobs":null,"finish_reason":%s,"stop_reason":null,"token_ids":%s}]}`, k, a.token(i), finish, a.tokenIDs(i)), true)
			default:
				send(head+fmt.Sprintf(`{"index":%d,"text":%q,"logprobs":null,"finish_reason":%s,"stop_reason":null,"prompt_token_ids":%s,"token_ids":%s}]}`,
					k, a.token(i), finish, firstOf(k), a.tokenIDs(i)), true)
			}
		}
		if mode != "burst" && !pause(r, time.Duration(a.script.DelayMS)*time.Millisecond) {
			return
		}
	}
	switch mode {
	case "midstream_error":
		send(`{"error": {"object": "error", "message": "engine exploded", "type": "InternalServerError", "param": null, "code": 500}}`, false)
		send("[DONE]", false)
		return
	case "break":
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err == nil {
			buf.Flush()
			conn.Close()
		}
		return
	case "nodone", "truncate":
		return
	}
	if a.view.IncludeUsage {
		send(fmt.Sprintf(`{"id":"%s%s","object":%q,"created":1,"model":%q,"choices":[],"usage":%s}`, a.prefix, a.id, a.object, a.view.Model, a.usage()), true)
	}
	send("[DONE]", false)
	if mode == "burst" {
		w.Write(pending.Bytes())
		fl.Flush()
	}
}

// cancelled reports a request whose client went away; a full channel
// drops it, so a test that does not read Cancelled never blocks the fake.
func (s *Server) cancelled(id string) {
	select {
	case s.Cancelled <- id:
	default:
	}
}

// pause waits d, or less if the client goes away (then false).
func pause(r *http.Request, d time.Duration) bool {
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
