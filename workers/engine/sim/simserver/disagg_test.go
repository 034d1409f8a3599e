package simserver

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// TestDisaggregated: the handshake of vLLM's disaggregated-serving proxy
// over HTTP, against two sim-servers: the prefill's JSON answer carries
// kv_transfer_params, the decode streams (or answers) with them as an
// aggregated run would, a second decode with the same params is refused
// with a 503, and both servers' metrics say so.
func TestDisaggregated(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		stream           bool
	}{
		{"chat stream", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"Write a haiku about the tide coming in over the rocks."}],"max_tokens":20,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"completion", "/v1/completions",
			`{"prompt":"The history of the lighthouse begins with the fires lit on hills along the coast","max_tokens":12,"ignore_eos":true}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := start(t, Config{}, fastSim()), start(t, Config{}, fastSim())
			ml := []string{"model_name", "base", "engine", "0"}

			pb, _ := schemas.PrefillBody([]byte(tc.body))
			resp := do(t, http.MethodPost, p.url+tc.path, string(pb))
			answer := readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("prefill: %d %s", resp.StatusCode, answer)
			}
			params := schemas.TransferParamsOf(answer)
			st := p.eng.KVTransferStats()
			host, port := schemas.TransferParamString(params, "remote_host"), schemas.TransferParamString(params, "remote_port")
			if params == nil || schemas.TransferParamString(params, "remote_engine_id") != p.eng.EngineID() ||
				net.JoinHostPort(host, port) != st.Addr || !strings.HasPrefix(string(params), `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[`) {
				t.Fatalf("prefill answer %s (stats %+v)", answer, st)
			}
			f := scrape(t, p.url)
			for _, c := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{mKVPrefills, ml, 1},
				{mKVHeldRequests, ml, 1},
				{mKVHeldBlocks, ml, float64(st.HeldBlocks)},
				{mKVCache, ml, float64(st.HeldBlocks) / float64(fastSim().NumBlocks)},
				{mKVExpired, ml, 0},
			} {
				if v := value(f, c.name, c.labels...); v != c.want {
					t.Errorf("prefill %s = %v, want %v", c.name, v, c.want)
				}
			}

			// The decode: the client's request with the params.
			db, _ := schemas.DecodeBody([]byte(tc.body), params)
			got := generate(t, d.url+tc.path, string(db), tc.stream)
			want := generate(t, p.url+tc.path, tc.body, tc.stream) // aggregated
			if got != want {
				t.Fatalf("decode answered\n%s\nan aggregated run\n%s", got, want)
			}
			prompt := p.eng.Metrics().PromptTokens - d.eng.Metrics().PromptTokens // the aggregated run's prompt
			f = scrape(t, d.url)
			for _, c := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{mRemotePrefills, ml, 1},
				{mKVFailed, ml, 0},
				{mPromptBySource, append(ml, "source", "external_kv_transfer"), float64(prompt)},
				{mPromptBySource, append(ml, "source", "local_compute"), 0},
				{mPromptBySource, append(ml, "source", "local_cache_hit"), 0},
			} {
				if v := value(f, c.name, c.labels...); v != c.want {
					t.Errorf("decode %s%v = %v, want %v", c.name, c.labels, v, c.want)
				}
			}
			testenv.WaitFor(t, 5*time.Second, func() error {
				f := scrape(t, p.url)
				if value(f, mKVPulls, append(ml, "outcome", "taken")...) != 1 || value(f, mKVHeldBlocks, ml...) != 0 {
					return fmt.Errorf("prefill pulls %v, held %v", value(f, mKVPulls, append(ml, "outcome", "taken")...), value(f, mKVHeldBlocks, ml...))
				}
				return nil
			})

			// The same params again: taken already, a 503 before any event.
			resp = do(t, http.MethodPost, d.url+tc.path, string(db))
			body := readAll(t, resp)
			e := decode[struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}](t, body)
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || e.Error.Code != 503 ||
				e.Error.Type != "Service Unavailable" || !strings.Contains(e.Error.Message, "could not take the prefilled KV cache of engine "+p.eng.EngineID()) {
				t.Fatalf("a second decode: %d %v %s", resp.StatusCode, resp.Header, body)
			}
			if v := value(scrape(t, d.url), mKVFailed, ml...); v != 1 {
				t.Errorf("decode %s = %v", mKVFailed, v)
			}
			if v := value(scrape(t, p.url), mKVPulls, append(ml, "outcome", "refused")...); v != 1 {
				t.Errorf("prefill %s{refused} = %v", mKVPulls, v)
			}
		})
	}
}

// generate runs a request and returns its text and usage, as a stream's
// chunks or a whole answer say them.
func generate(t *testing.T, url, body string, stream bool) string {
	t.Helper()
	resp := do(t, http.MethodPost, url, body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, readAll(t, resp))
	}
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	if !stream {
		a := decode[struct {
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}](t, readAll(t, resp))
		return fmt.Sprintf("%+v", a)
	}
	var text strings.Builder
	var u usage
	for _, ev := range sse(t, resp) {
		c := decode[struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}](t, []byte(ev))
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != nil {
				text.WriteString(" [" + *ch.FinishReason + "]")
			}
		}
		if c.Usage != nil {
			u = *c.Usage
		}
	}
	return text.String() + " " + strconv.Itoa(u.PromptTokens) + "+" + strconv.Itoa(u.CompletionTokens)
}

// TestDisaggregatedExpiry: a hold no decode takes is freed after the hold
// time, counted as vLLM counts it.
func TestDisaggregatedExpiry(t *testing.T) {
	sc := fastSim()
	sc.KVHoldTime = 20 * time.Millisecond
	p := start(t, Config{}, sc)
	ml := []string{"model_name", "base", "engine", "0"}
	pb, _ := schemas.PrefillBody([]byte(`{"messages":[{"role":"user","content":"` + longPrompt + `"}]}`))
	if resp := do(t, http.MethodPost, p.url+"/v1/chat/completions", string(pb)); resp.StatusCode != 200 {
		t.Fatalf("prefill: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		f := scrape(t, p.url)
		if value(f, mKVExpired, ml...) != 1 || value(f, mKVHeldBlocks, ml...) != 0 || value(f, mKVCache, ml...) != 0 {
			return fmt.Errorf("expired %v, held %v, KV cache %v", value(f, mKVExpired, ml...), value(f, mKVHeldBlocks, ml...), value(f, mKVCache, ml...))
		}
		return nil
	})
}
