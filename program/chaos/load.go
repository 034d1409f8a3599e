package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// request is what every stream asks: the same prompt and seed, so the sim
// produces the same text for each, with ignore_eos so it is exactly tokens
// long. One SSE chunk carries one token (the sim makes one chunk per
// sequence per step), so a stream's chunks compared with a reference
// stream's show every token lost or repeated.
func requestBody(tokens int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "prompt": "The chaos harness counts every token of this story:",
		"max_tokens": tokens, "ignore_eos": true, "seed": 13, "stream": true,
	})
	return b
}

// stream is what one client saw of one request.
type stream struct {
	gateway int
	tokens  []string    // the text of each chunk, in order
	events  []time.Time // arrival of each data line, and of a connection error
	code    string      // "" completed; else the error code (or a client-side failure)
	shaped  bool        // the error was an OpenAI error object ({"error":{"message","type","code"}})
	status  int         // HTTP status
	start   time.Time
	end     time.Time
}

func (s *stream) failed() bool { return s.code != "" }

// longestGap is the longest silence between consecutive chunks (the error
// event or connection error that ends a broken stream counts as a chunk).
func (s *stream) longestGap() time.Duration {
	var g time.Duration
	for i := 1; i < len(s.events); i++ {
		g = max(g, s.events[i].Sub(s.events[i-1]))
	}
	return g
}

// client sends streaming completions and reads their SSE.
type client struct {
	http   *http.Client
	apiKey string
	body   []byte
	limit  time.Duration // bound on one stream: a hang shows as client_timeout
	chunks atomic.Int64  // tokens received by every stream so far
}

func newClient(apiKey string, tokens int, limit time.Duration) *client {
	tr := &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 30 * time.Second,
		DisableCompression: true, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	return &client{http: &http.Client{Transport: tr}, apiKey: apiKey, body: requestBody(tokens), limit: limit}
}

// run sends one request to base and reads it to its end.
func (c *client) run(ctx context.Context, base string, gw int) *stream {
	s := &stream{gateway: gw, start: time.Now()}
	defer func() { s.end = time.Now() }()
	ctx, cancel := context.WithTimeout(ctx, c.limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(c.body))
	if err != nil {
		s.code = "client_error"
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		s.code = netCode(ctx, err)
		return s
	}
	defer resp.Body.Close()
	s.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		s.code, s.shaped = errorCode(b)
		if s.code == "" {
			s.code = "http_" + strconv.Itoa(resp.StatusCode)
		}
		return s
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			s.events = append(s.events, time.Now())
			if errors.Is(err, io.EOF) {
				s.code = "conn_eof" // the body ended without [DONE]
			} else {
				s.code = netCode(ctx, err)
			}
			return s
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			continue
		}
		s.events = append(s.events, time.Now())
		if string(data) == "[DONE]" {
			return s
		}
		var ch struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			s.code = "bad_chunk"
			return s
		}
		if ch.Error != nil {
			// The stream goes on to [DONE]; the error decides the outcome.
			s.code, s.shaped = errorCode(data)
			continue
		}
		for _, c0 := range ch.Choices {
			if c0.Text != "" {
				s.tokens = append(s.tokens, c0.Text)
				c.chunks.Add(1)
			}
		}
	}
}

// errorCode reads an OpenAI error object; shaped says it had a message, a
// type and a code.
func errorCode(b []byte) (code string, shaped bool) {
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == nil {
		return "not_json", false
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	if code == "" {
		code = "no_code"
	}
	return code, e.Error.Message != "" && e.Error.Type != "" && e.Error.Code != nil
}

// netCode names a client-side failure.
func netCode(ctx context.Context, err error) string {
	switch {
	case ctx.Err() != nil:
		return "client_timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "conn_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF):
		return "conn_reset"
	}
	return "conn_error"
}

// load runs n clients at once, spread round-robin over the gateways; each
// sends one request, or, with until set, requests back to back until then,
// the clients starting one after the other over stagger.
func (c *client) load(ctx context.Context, bases []string, n int, until time.Time, stagger time.Duration) []*stream {
	var (
		mu  sync.Mutex
		out []*stream
		wg  sync.WaitGroup
	)
	for i := range n {
		gw := i % len(bases)
		wg.Go(func() {
			if !until.IsZero() {
				// Staggered starts: requests begin all the time, so a
				// fault finds some being routed, not only some streaming.
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(i) * stagger / time.Duration(n)):
				}
			}
			for {
				s := c.run(ctx, bases[gw], gw)
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
				if until.IsZero() || time.Now().After(until) || ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return out
}

// tally compares a stream's tokens with the reference: lost are reference
// tokens missing from it, duplicated are tokens it has beyond the
// reference, both from a longest common subsequence (so a repeated or
// skipped stretch shows as such, not as everything after it being wrong).
func tally(ref, got []string) (lost, dup int) {
	n, m := len(ref), len(got)
	prev, cur := make([]int, m+1), make([]int, m+1)
	for i := 1; i <= n; i++ {
		for j := 1; j <= m; j++ {
			switch {
			case ref[i-1] == got[j-1]:
				cur[j] = prev[j-1] + 1
			case prev[j] >= cur[j-1]:
				cur[j] = prev[j]
			default:
				cur[j] = cur[j-1]
			}
		}
		prev, cur = cur, prev
	}
	common := prev[m]
	return n - common, m - common
}

// probe is one short request sent right after the fault.
type probe struct {
	Result  string  `json:"result"` // "ok" or the error code
	Seconds float64 `json:"seconds"`
	// RecoveredAfter: when it failed, the time from the fault until a
	// request succeeded (nil: none did within 30 s, or it did not fail).
	RecoveredAfter *float64 `json:"recovered_after_s,omitempty"`
}

func (p probe) String() string {
	s := fmt.Sprintf("%s in %.2f s", p.Result, p.Seconds)
	switch {
	case p.Result == "ok":
	case p.RecoveredAfter != nil:
		s += fmt.Sprintf(" (served again %.1f s after the fault)", *p.RecoveredAfter)
	default:
		s += " (not served again within 30 s)"
	}
	return s
}
