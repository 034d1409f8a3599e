package simserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// response covers chat.completion, text_completion and their chunks.
type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// text is the output per choice index of a response or of its chunks.
func text(rs ...response) map[int]string {
	out := map[int]string{}
	for _, r := range rs {
		for _, c := range r.Choices {
			switch {
			case c.Text != nil:
				out[c.Index] += *c.Text
			case c.Message != nil:
				out[c.Index] += c.Message.Content
			case c.Delta != nil && c.Delta.Content != nil:
				out[c.Index] += *c.Delta.Content
			}
		}
	}
	return out
}

func TestGenerate(t *testing.T) {
	ts := start(t, Config{}, fastSim())
	const chat = `"model":"base","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":12,"seed":7`
	const compl = `"model":"base","prompt":"Once upon a time","max_tokens":12,"seed":7`
	for _, tc := range []struct {
		name, path, fields, extra string
		object, idPrefix          string
		usageChunk                bool
		choices                   int
	}{
		{"chat", "/v1/chat/completions", chat, "", "chat.completion", "chatcmpl-", false, 1},
		{"chat usage", "/v1/chat/completions", chat, `,"stream_options":{"include_usage":true}`, "chat.completion", "chatcmpl-", true, 1},
		{"chat stream_options {} means usage", "/v1/chat/completions", chat, `,"stream_options":{}`, "chat.completion", "chatcmpl-", true, 1},
		{"chat n=2", "/v1/chat/completions", chat, `,"n":2`, "chat.completion", "chatcmpl-", false, 2},
		{"completion", "/v1/completions", compl, "", "text_completion", "cmpl-", false, 1},
		{"completion usage", "/v1/completions", compl, `,"stream_options":{"include_usage":true}`, "text_completion", "cmpl-", true, 1},
		{"completion n=3", "/v1/completions", compl, `,"n":3`, "text_completion", "cmpl-", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The whole response first (stream_options is for streams only).
			resp := do(t, http.MethodPost, ts.url+tc.path, "{"+tc.fields+strings.Replace(tc.extra, "stream_options", "x_ignored", 1)+"}",
				"X-Request-Id", "whole-1")
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			whole := decode[response](t, readAll(t, resp))
			if whole.Object != tc.object || whole.ID != tc.idPrefix+"whole-1" || whole.Model != "base" || whole.Usage == nil ||
				len(whole.Choices) != tc.choices {
				t.Fatalf("response %+v", whole)
			}

			resp = do(t, http.MethodPost, ts.url+tc.path, "{"+tc.fields+`,"stream":true`+tc.extra+"}", "X-Request-Id", "stream-1")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			events := sse(t, resp)
			var chunks []response
			for _, ev := range events {
				chunks = append(chunks, decode[response](t, []byte(ev)))
			}
			for i, c := range chunks {
				if c.Object != tc.object+".chunk" && !(tc.object == "text_completion" && c.Object == tc.object) {
					t.Errorf("chunk %d: object %q", i, c.Object)
				}
				if c.ID != tc.idPrefix+"stream-1" {
					t.Errorf("chunk %d: id %q", i, c.ID)
				}
				last := i == len(chunks)-1
				if (c.Usage != nil) != (tc.usageChunk && last) {
					t.Errorf("chunk %d of %d: usage %+v (usage chunk wanted: %v)", i, len(chunks), c.Usage, tc.usageChunk)
				}
			}
			if tc.usageChunk {
				u := chunks[len(chunks)-1]
				if len(u.Choices) != 0 || *u.Usage != *whole.Usage {
					t.Errorf("usage chunk %+v, the whole response's usage %+v", u, *whole.Usage)
				}
			}
			if tc.object == "chat.completion" {
				if d := chunks[0].Choices[0].Delta; d == nil || d.Role == nil || *d.Role != "assistant" {
					t.Errorf("first chunk %s carries no role", events[0])
				}
			}
			// Same seed, same prompt: the stream says what the whole response said.
			if got, want := text(chunks...), text(whole); fmt.Sprint(got) != fmt.Sprint(want) || len(want) != tc.choices {
				t.Errorf("streamed text %v, whole text %v", got, want)
			}
		})
	}
}

type errorBody struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

func TestErrors(t *testing.T) {
	nested := start(t, Config{APIKeys: []string{"k1", "k2"}}, fastSim())
	legacy := start(t, Config{LegacyErrors: true}, fastSim())
	auth := []string{"Authorization", "Bearer k2"}
	const chat = `{"model":"base","messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name      string
		ts        *testServer
		method    string
		path      string
		body      string
		headers   []string
		status    int
		want      string // exact body, or a message fragment for the error shapes
		shape     string // "nested", "flat" or "" (exact body)
		errType   string
		param     string
		streaming bool
	}{
		{"no content type", nested, "POST", "/v1/chat/completions", chat + "}", append(auth, "Content-Type", ""), 415,
			"Only 'application/json' is allowed", "nested", "Unsupported Media Type", "", false},
		{"text/plain", nested, "POST", "/v1/completions", `{"prompt":"x"}`, append(auth, "Content-Type", "text/plain"), 415,
			"Only 'application/json' is allowed", "nested", "Unsupported Media Type", "", false},
		{"charset is fine", nested, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`,
			append(auth, "Content-Type", "Application/JSON; charset=utf-8"), 200, "", "", "", "", false},
		{"bad field from the sim", nested, "POST", "/v1/chat/completions", chat + `,"max_tokens":0}`, auth, 400,
			"Expected a value >= 1", "nested", "BadRequestError", "max_tokens", false},
		{"bad field, stream", nested, "POST", "/v1/chat/completions", chat + `,"max_tokens":0,"stream":true}`, auth, 400,
			"Expected a value >= 1", "nested", "BadRequestError", "max_tokens", true},
		{"stream_options without stream", nested, "POST", "/v1/completions", `{"prompt":"x","stream_options":{}}`, auth, 400,
			"Stream options can only be defined when `stream=True`.", "nested", "BadRequestError", "stream_options", false},
		{"context length", nested, "POST", "/v1/completions", `{"prompt":"x","max_tokens":9000}`, auth, 400,
			"This model's maximum context length is 8192 tokens", "nested", "BadRequestError", "prompt", false},
		{"malformed JSON", nested, "POST", "/v1/chat/completions", `{"messages":`, auth, 400,
			"could not parse the JSON body", "nested", "BadRequestError", "", false},
		{"unknown model", nested, "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, auth, 404,
			"The model `nope` does not exist.", "nested", "NotFoundError", "model", false},
		{"unknown model, stream", nested, "POST", "/v1/completions", `{"model":"nope","prompt":"x","stream":true}`, auth, 404,
			"The model `nope` does not exist.", "nested", "NotFoundError", "model", true},
		{"flat shape", legacy, "POST", "/v1/chat/completions", chat + `,"n":0}`, nil, 400,
			"Expected a value >= 1", "flat", "BadRequestError", "n", false},
		{"flat 404", legacy, "POST", "/v1/completions", `{"model":"nope","prompt":"x"}`, nil, 404,
			"does not exist", "flat", "NotFoundError", "model", false},
		{"no key", nested, "POST", "/v1/chat/completions", chat + "}", nil, 401, `{"error":"Unauthorized"}`, "", "", "", false},
		{"wrong key", nested, "GET", "/v1/models", "", []string{"Authorization", "Bearer k3"}, 401, `{"error":"Unauthorized"}`, "", "", "", false},
		{"not bearer", nested, "GET", "/v1/models", "", []string{"Authorization", "k1"}, 401, `{"error":"Unauthorized"}`, "", "", "", false},
		{"key ok", nested, "GET", "/v1/models", "", []string{"Authorization", "Bearer k1"}, 200, "", "", "", "", false},
		{"scheme in any case", nested, "GET", "/v1/models", "", []string{"Authorization", "bearer k2"}, 200, "", "", "", "", false},
		{"no key outside /v1", nested, "GET", "/health", "", nil, 200, "", "", "", "", false},
		{"unknown route", nested, "GET", "/v2/whatever", "", nil, 404, `{"detail":"Not Found"}`, "", "", "", false},
		{"runtime LoRA off", legacy, "POST", "/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/a"}`, nil, 404,
			`{"detail":"Not Found"}`, "", "", "", false},
		{"wrong method", legacy, "GET", "/v1/completions", "", nil, 405, `{"detail":"Method Not Allowed"}`, "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(t, tc.method, tc.ts.url+tc.path, tc.body, tc.headers...)
			body := readAll(t, resp)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 200 {
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			switch tc.shape {
			case "":
				if string(body) != tc.want {
					t.Errorf("body %s, want %s", body, tc.want)
				}
				return
			case "nested":
				var keys map[string]map[string]json.RawMessage
				if err := json.Unmarshal(body, &keys); err != nil || len(keys) != 1 || len(keys["error"]) != 4 {
					t.Fatalf("not the nested shape with four keys: %s", body)
				}
			case "flat":
				var keys map[string]json.RawMessage
				if err := json.Unmarshal(body, &keys); err != nil || len(keys) != 5 || string(keys["object"]) != `"error"` {
					t.Fatalf("not the flat shape: %s", body)
				}
				body = []byte(`{"error":` + string(body) + `}`)
			}
			e := decode[errorBody](t, body).Error
			param := ""
			if e.Param != nil {
				param = *e.Param
			}
			if !strings.Contains(e.Message, tc.want) || e.Type != tc.errType || param != tc.param || e.Code != float64(tc.status) {
				t.Errorf("error %+v (param %q), want message ~%q, type %q, param %q, code %d", e, param, tc.want, tc.errType, tc.param, tc.status)
			}
		})
	}
}

// TestMidStreamError: an error after the stream began (the engine shut
// down) is an error event, then [DONE], as vLLM sends it.
func TestMidStreamError(t *testing.T) {
	ts := start(t, Config{}, slowSim())
	resp := do(t, http.MethodPost, ts.url+"/v1/completions", `{"prompt":"hi","max_tokens":1000,"ignore_eos":true,"stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	running(t, ts.eng, 1)
	ts.eng.Close() // what the stream sent meanwhile waits in the connection
	events := sse(t, resp)
	last := decode[errorBody](t, []byte(events[len(events)-1]))
	if last.Error == nil || last.Error.Code != float64(503) || last.Error.Type != "Service Unavailable" {
		t.Fatalf("last event %s, want a 503 error object", events[len(events)-1])
	}
	if len(events) < 2 {
		t.Errorf("no chunk before the error: %v", events)
	}
}

func TestHealthVersion(t *testing.T) {
	ts := start(t, Config{}, fastSim())
	resp := do(t, http.MethodGet, ts.url+"/health", "")
	if b := readAll(t, resp); resp.StatusCode != 200 || len(b) != 0 {
		t.Errorf("/health: %d %q", resp.StatusCode, b)
	}
	resp = do(t, http.MethodGet, ts.url+"/version", "")
	if v := decode[map[string]string](t, readAll(t, resp)); resp.StatusCode != 200 || v["version"] != DefaultVersion || len(v) != 1 {
		t.Errorf("/version: %d %v", resp.StatusCode, v)
	}
	ts.Close()
	resp = do(t, http.MethodGet, ts.url+"/health", "")
	if readAll(t, resp); resp.StatusCode != 503 {
		t.Errorf("/health after Close: %d", resp.StatusCode)
	}

	other := start(t, Config{}, fastSim())
	other.eng.Close()
	resp = do(t, http.MethodGet, other.url+"/health", "")
	if readAll(t, resp); resp.StatusCode != 503 {
		t.Errorf("/health with the engine shut: %d", resp.StatusCode)
	}
}

// TestServeShutdown: Serve returns once its context ends, cutting a stream
// that outlives ShutdownTimeout, which aborts it in the sim.
func TestServeShutdown(t *testing.T) {
	eng := newSim(t, slowSim())
	s := New(Config{ShutdownTimeout: 100 * time.Millisecond}, eng, nil)
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	resp := do(t, http.MethodPost, url+"/v1/completions", `{"prompt":"hi","max_tokens":5000,"ignore_eos":true,"stream":true}`)
	firstEvent(t, resp)
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	resp.Body.Close()
	aborted(t, eng, 1) // the cut stream
}
