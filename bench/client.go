package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// afterDoneGrace is how long a server may keep a response open after
// `data: [DONE]` before the request counts as protocol_open_after_done.
var afterDoneGrace = 2 * time.Second

// maxErrorBody caps how much of a non-200 body is read for the report.
const maxErrorBody = 4 << 10

// maxLine caps one SSE line (a chunk); longer is protocol_line_too_long.
const maxLine = 16 << 20

// record is the outcome of one request.
type record struct {
	Prompt       int           // index into the prompt list
	Start        time.Duration // send time on its target's load clock (see runner)
	E2E          time.Duration // send to [DONE] (stream) or to the full body
	Chunks       []uint32      // arrival of each content chunk, µs after send
	Tokens       int           // output tokens: usage.completion_tokens, else content chunks
	FromUsage    bool          // Tokens came from a usage object
	PromptTokens int           // usage.prompt_tokens, else the prompt's estimate
	CachedTokens int           // usage.prompt_tokens_details.cached_tokens
	Turn         int           // a session's turn, 1-based; 0 outside --sessions
	Text         []byte        // with caller.collect: the answer's content, raw JSON string contents
	Err          string        // "" or the failure kind
	ErrMsg       string        // detail for the first failures of a kind
	ErrCode      string        // a non-200 answer's error code (OpenAI's error.code), if any
	RetryAfter   string        // a non-200 answer's Retry-After header, if any
	Cancelled    bool          // cut by --duration or ctx; neither completed nor failed
}

// TTFT is the time to the first content chunk; for a non-stream request, E2E.
func (r *record) TTFT() time.Duration {
	if len(r.Chunks) == 0 {
		return r.E2E
	}
	return time.Duration(r.Chunks[0]) * time.Microsecond
}

func (r *record) ok() bool { return r.Err == "" && !r.Cancelled }

func (r *record) fail(kind, msg string) {
	if r.Err == "" {
		r.Err, r.ErrMsg = kind, msg
	}
}

// caller sends requests to one endpoint.
type caller struct {
	urls      []string      // full endpoint URLs: one, or several (--url a,b) that requests take in turn
	next      atomic.Uint64 // the next of urls
	apiKey    string
	chat      bool
	embed     bool // /embeddings: the answer is a list of embeddings
	stream    bool
	usage     bool // stream_options.include_usage was sent
	timeout   time.Duration
	client    *http.Client
	onChunk   func() // progress hook, per content chunk; may be nil
	maxChunks int    // capacity hint for Chunks
	collect   bool   // keep the answer's text in record.Text (--sessions builds the next turn on it)
}

func newTransport(concurrency int) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		MaxIdleConns:          2*concurrency + 16,
		MaxIdleConnsPerHost:   2*concurrency + 16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 0,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// do sends one request and fills rec. parent is the run's context: when it is
// done the request counts as cancelled, not failed.
func (c *caller) do(parent context.Context, body []byte, rec *record) {
	ctx, cancel := context.WithTimeout(parent, c.timeout)
	defer cancel()
	url := c.urls[0]
	if len(c.urls) > 1 {
		url = c.urls[(c.next.Add(1)-1)%uint64(len(c.urls))]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		rec.fail("request", err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if c.stream {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	t0 := time.Now()
	resp, err := c.client.Do(req)
	if err != nil {
		c.transportError(parent, ctx, err, rec, nil)
		rec.E2E = time.Since(t0)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		rec.fail("http_"+strconv.Itoa(resp.StatusCode), errorMessage(b))
		rec.ErrCode, rec.RetryAfter = errorCode(b), resp.Header.Get("Retry-After")
		rec.E2E = time.Since(t0)
		return
	}
	if c.stream {
		c.readStream(parent, ctx, cancel, t0, resp, rec)
	} else {
		c.readJSON(parent, ctx, t0, resp, rec)
	}
}

// transportError classifies a failed Do or body read.
func (c *caller) transportError(parent, ctx context.Context, err error, rec *record, lingered *atomic.Bool) {
	switch {
	case parent.Err() != nil:
		rec.Cancelled = true
	case lingered != nil && lingered.Load():
		rec.fail("protocol_open_after_done", "response not closed after data: [DONE]")
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || isTimeout(err):
		rec.fail("timeout", err.Error())
	default:
		rec.fail("connection", err.Error())
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// errorMessage shortens a non-200 body to its error message when it is
// OpenAI's {"error":{"message":...}} or vLLM's old flat {"message":...}.
func errorMessage(b []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(b, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		if len(e.Error) > 0 && json.Unmarshal(e.Error, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
		if len(e.Error) > 0 && e.Error[0] == '"' {
			var s string
			_ = json.Unmarshal(e.Error, &s)
			return s
		}
		if e.Message != "" {
			return e.Message
		}
	}
	return strings.TrimSpace(string(b))
}

// errorCode is a non-200 body's error code: OpenAI's {"error":{"code":...}}
// (a string, or a number as vLLM sends), else vLLM's old flat {"code":...};
// "" when there is none.
func errorCode(b []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
		Code  json.RawMessage `json:"code"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	code := e.Code
	var inner struct {
		Code json.RawMessage `json:"code"`
	}
	if len(e.Error) > 0 && json.Unmarshal(e.Error, &inner) == nil && len(inner.Code) > 0 {
		code = inner.Code
	}
	var s string
	switch {
	case len(code) == 0 || string(code) == "null":
		return ""
	case json.Unmarshal(code, &s) == nil:
		return s
	default:
		return string(code) // a number
	}
}

func (c *caller) readStream(parent, ctx context.Context, cancel context.CancelFunc, t0 time.Time, resp *http.Response, rec *record) {
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		rec.fail("protocol_content_type", "Content-Type "+strconv.Quote(resp.Header.Get("Content-Type"))+": "+errorMessage(b))
		rec.E2E = time.Since(t0)
		return
	}
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	defer func() { br.Reset(nil); readerPool.Put(br) }()

	chk := streamCheck{object: "text_completion"}
	if c.chat {
		chk.object = "chat.completion.chunk"
	}
	rec.Chunks = make([]uint32, 0, c.maxChunks)
	var (
		ch        schemas.Chunk
		sawDone   bool
		gotUsage  bool
		long      []byte
		lingered  atomic.Bool
		doneTimer *time.Timer
	)
	defer func() {
		if doneTimer != nil {
			doneTimer.Stop()
		}
	}()
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long[:0], line...)
			for err == bufio.ErrBufferFull && len(long) <= maxLine {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			if len(long) > maxLine {
				rec.fail("protocol_line_too_long", "SSE line over 16 MiB")
				break
			}
			line = long
		}
		if err != nil && (err != io.EOF || len(line) == 0) {
			if err == io.EOF {
				if !sawDone {
					rec.fail("protocol_missing_done", "stream ended without data: [DONE]")
				}
			} else {
				c.transportError(parent, ctx, err, rec, &lingered)
			}
			break
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			continue
		}
		if !bytes.HasPrefix(line, []byte("data:")) {
			rec.fail("protocol_non_data_line", "non-data SSE line "+strconv.Quote(clip(line)))
			break
		}
		payload := line[5:]
		if len(payload) > 0 && payload[0] == ' ' {
			payload = payload[1:]
		}
		if sawDone {
			rec.fail("protocol_data_after_done", "data after [DONE]: "+strconv.Quote(clip(payload)))
			break
		}
		if string(payload) == "[DONE]" {
			sawDone = true
			rec.E2E = time.Since(t0)
			doneTimer = time.AfterFunc(afterDoneGrace, func() { lingered.Store(true); cancel() })
			continue
		}
		now := time.Since(t0)
		if err := schemas.ReadChunk(payload, &ch); err != nil {
			rec.fail("protocol_bad_json", "bad chunk: "+strconv.Quote(clip(payload)))
			break
		}
		if kind, msg := chk.check(&ch); kind != "" {
			rec.fail(kind, msg)
			break
		}
		for i := range ch.Choices {
			if len(ch.Choices[i].Content) > 0 {
				rec.Chunks = append(rec.Chunks, uint32(now/time.Microsecond))
				if c.collect {
					rec.Text = append(rec.Text, ch.Choices[i].Content...)
				}
				if c.onChunk != nil {
					c.onChunk()
				}
				break
			}
		}
		if ch.Usage != nil {
			gotUsage = true
			rec.Tokens = ch.Usage.CompletionTokens
			rec.PromptTokens = ch.Usage.PromptTokens
			if d := ch.Usage.PromptTokensDetails; d != nil {
				rec.CachedTokens = d.CachedTokens
			}
		}
	}
	if rec.Err != "" || rec.Cancelled {
		if rec.E2E == 0 {
			rec.E2E = time.Since(t0)
		}
		return
	}
	switch {
	case !chk.finished:
		rec.fail("protocol_missing_finish_reason", "choice 0 never got a finish_reason")
	case c.usage && !gotUsage:
		rec.fail("protocol_missing_usage", "no usage chunk although stream_options.include_usage was sent")
	}
	if gotUsage {
		rec.FromUsage = true
	} else {
		rec.Tokens = len(rec.Chunks)
	}
}

func (c *caller) readJSON(parent, ctx context.Context, t0 time.Time, resp *http.Response, rec *record) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	rec.E2E = time.Since(t0)
	if err != nil {
		c.transportError(parent, ctx, err, rec, nil)
		return
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		rec.fail("protocol_content_type", "Content-Type "+strconv.Quote(resp.Header.Get("Content-Type")))
		return
	}
	if c.embed {
		readEmbeddings(b, rec)
		return
	}
	var ch schemas.Chunk
	if err := schemas.ReadChunk(b, &ch); err != nil {
		rec.fail("protocol_bad_json", "bad response body: "+strconv.Quote(clip(b)))
		return
	}
	chk := streamCheck{object: "text_completion"}
	if c.chat {
		chk.object = "chat.completion"
	}
	if kind, msg := chk.check(&ch); kind != "" {
		rec.fail(kind, msg)
		return
	}
	if len(ch.Choices) != 1 {
		rec.fail("protocol_choices", strconv.Itoa(len(ch.Choices))+" choices, want 1")
		return
	}
	if !chk.finished {
		rec.fail("protocol_missing_finish_reason", "choice 0 has no finish_reason")
		return
	}
	if c.collect {
		rec.Text = append(rec.Text, ch.Choices[0].Content...)
	}
	if ch.Usage != nil {
		rec.Tokens, rec.PromptTokens, rec.FromUsage = ch.Usage.CompletionTokens, ch.Usage.PromptTokens, true
		if d := ch.Usage.PromptTokensDetails; d != nil {
			rec.CachedTokens = d.CachedTokens
		}
	} else {
		rec.Tokens = len(strings.Fields(schemas.String(ch.Choices[0].Content)))
	}
}

// readEmbeddings checks an embeddings answer to one input (object "list",
// one item of object "embedding" at index 0 with a non-empty embedding, a
// list of floats or a base64 string, and usage) and records its prompt
// tokens; it generates none.
func readEmbeddings(b []byte, rec *record) {
	var r struct {
		Object string `json:"object"`
		Data   []struct {
			Index     int             `json:"index"`
			Object    string          `json:"object"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Usage *schemas.Usage `json:"usage"`
	}
	switch {
	case json.Unmarshal(b, &r) != nil:
		rec.fail("protocol_bad_json", "bad response body: "+strconv.Quote(clip(b)))
	case r.Object != "list":
		rec.fail("protocol_object", "object "+strconv.Quote(r.Object)+", want \"list\"")
	case len(r.Data) != 1 || r.Data[0].Index != 0 || r.Data[0].Object != "embedding":
		rec.fail("protocol_data", "want one embedding at index 0: "+strconv.Quote(clip(b)))
	case len(r.Data[0].Embedding) < 3 || string(r.Data[0].Embedding) == "[]" || string(r.Data[0].Embedding) == `""`:
		rec.fail("protocol_data", "empty embedding")
	case r.Usage == nil:
		rec.fail("protocol_missing_usage", "no usage")
	default:
		rec.PromptTokens, rec.FromUsage = r.Usage.PromptTokens, true
	}
}

// clip shortens b for an error message.
func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
