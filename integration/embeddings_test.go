package integration

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/schemas"
)

func cosine(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// Embeddings through the bus to the sim, with the official Go SDK, on both
// route forms: shapes, usage, unit vectors, similar texts closer than
// unrelated ones, and the same vector for the same text every time.
func TestEmbeddingsOpenAIGo(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, base := range []string{d.URL + "/v1", d.URL + "/predictions/llama-8b/1.0/v1"} {
		c := openaiClient(base)
		texts := []string{"The cat sat on the mat.", "A cat sitting on the mat", "Interest rates rose again in March"}
		resp, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "llama-8b",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts},
		})
		if err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		if resp.Object != "list" || resp.Model != "llama-8b" || len(resp.Data) != 3 {
			t.Fatalf("%s: %s", base, resp.RawJSON())
		}
		if resp.Usage.PromptTokens <= 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens {
			t.Errorf("usage %+v", resp.Usage)
		}
		for i, e := range resp.Data {
			if e.Index != int64(i) || len(e.Embedding) != 384 || math.Abs(cosine(e.Embedding, e.Embedding)-1) > 1e-5 {
				t.Fatalf("data[%d]: index %d, %d dims, norm² %v", i, e.Index, len(e.Embedding), cosine(e.Embedding, e.Embedding))
			}
		}
		similar, unrelated := cosine(resp.Data[0].Embedding, resp.Data[1].Embedding), cosine(resp.Data[0].Embedding, resp.Data[2].Embedding)
		if similar <= unrelated+0.2 {
			t.Errorf("cosine similar %.3f, unrelated %.3f", similar, unrelated)
		}
		one, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model:      "llama-8b",
			Input:      openai.EmbeddingNewParamsInputUnion{OfString: openai.String(texts[0])},
			Dimensions: openai.Int(32),
			User:       openai.String("u1"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if v := one.Data[0].Embedding; len(v) != 32 || math.Abs(cosine(v, v)-1) > 1e-5 {
			t.Fatalf("dimensions 32: %d dims", len(v))
		}
	}

	// base64: little-endian float32, the same values as float.
	f := post(t, d.URL, "/v1/embeddings", `{"model":"llama-8b","input":"hello world"}`)
	b := post(t, d.URL, "/v1/embeddings", `{"model":"llama-8b","input":"hello world","encoding_format":"base64"}`)
	var fr struct {
		Data []struct{ Embedding []float32 } `json:"data"`
	}
	var br struct {
		Data []struct{ Embedding string } `json:"data"`
	}
	if f.Status != 200 || b.Status != 200 || json.Unmarshal([]byte(f.Body), &fr) != nil || json.Unmarshal([]byte(b.Body), &br) != nil {
		t.Fatalf("float %d %s; base64 %d %s", f.Status, f.Body, b.Status, b.Body)
	}
	raw, err := base64.StdEncoding.DecodeString(br.Data[0].Embedding)
	if err != nil || len(raw) != 4*len(fr.Data[0].Embedding) {
		t.Fatalf("base64: %v, %d bytes for %d floats", err, len(raw), len(fr.Data[0].Embedding))
	}
	for i, x := range fr.Data[0].Embedding {
		if y := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); y != x {
			t.Fatalf("value %d: float %v, base64 %v", i, x, y)
		}
	}
}

// Errors in OpenAI's shape, with OpenAI's statuses and codes.
func TestEmbeddingsErrors(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	for _, tc := range []struct {
		name, body  string
		status      int
		code, param string
		path        string
	}{
		{"no input", `{"model":"llama-8b"}`, 400, "missing_required_parameter", "input", ""},
		{"empty input", `{"model":"llama-8b","input":""}`, 400, "invalid_value", "input", ""},
		{"empty list", `{"model":"llama-8b","input":[]}`, 400, "empty_array", "input", ""},
		{"wrong input type", `{"model":"llama-8b","input":{"a":1}}`, 400, "invalid_type", "input", ""},
		{"mixed input", `{"model":"llama-8b","input":["a",[1]]}`, 400, "invalid_type", "input", ""},
		{"bad encoding_format", `{"model":"llama-8b","input":"a","encoding_format":"int8"}`, 400, "invalid_value", "encoding_format", ""},
		{"dimensions 0", `{"model":"llama-8b","input":"a","dimensions":0}`, 400, "integer_below_min_value", "dimensions", ""},
		{"too many dimensions", `{"model":"llama-8b","input":"a","dimensions":4096}`, 400, "integer_above_max_value", "dimensions", ""},
		{"no model", `{"input":"a"}`, 400, "missing_required_parameter", "model", ""},
		{"model not found", `{"model":"nope","input":"a"}`, 404, "model_not_found", "model", ""},
		{"TorchServe path names another model", `{"model":"other","input":"a"}`, 400, "model_mismatch", "model", "/predictions/llama-8b/1.0/v1/embeddings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = "/v1/embeddings"
			}
			r := post(t, d.URL, path, tc.body)
			e := errorBody(t, r.Body)
			if r.Status != tc.status || e.Code == nil || *e.Code != tc.code || e.Param == nil || *e.Param != tc.param {
				t.Fatalf("%d %s, want %d %s param %s", r.Status, r.Body, tc.status, tc.code, tc.param)
			}
		})
	}
	// The Go SDK reads them as API errors.
	c := openaiClient(d.URL + "/v1")
	_, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "nope", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("a")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model through the SDK: %v", err)
	}
}

// vLLM's /tokenize and /detokenize through the bus to the sim, at the root
// only, as vLLM serves them.
func TestTokenizeThroughTheBus(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	r := post(t, d.URL, "/tokenize", `{"model":"llama-8b","prompt":"Hello world","return_token_strs":true}`)
	var tok struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []int    `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}
	if r.Status != 200 || json.Unmarshal([]byte(r.Body), &tok) != nil || tok.Count != 2 || len(tok.Tokens) != 2 ||
		tok.MaxModelLen <= 0 || len(tok.TokenStrs) != 2 || tok.TokenStrs[0] != "Hello" {
		t.Fatalf("tokenize: %d %s", r.Status, r.Body)
	}
	// The chat form counts what a chat request's usage counts.
	r = post(t, d.URL, "/tokenize", `{"model":"llama-8b","messages":[{"role":"user","content":"Hi there"}]}`)
	var chat struct {
		Count int `json:"count"`
	}
	c := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","max_tokens":1,"messages":[{"role":"user","content":"Hi there"}]}`)
	var cu struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if r.Status != 200 || json.Unmarshal([]byte(r.Body), &chat) != nil || json.Unmarshal([]byte(c.Body), &cu) != nil ||
		chat.Count == 0 || chat.Count != cu.Usage.PromptTokens {
		t.Fatalf("tokenize messages: %s; chat usage: %s", r.Body, c.Body)
	}
	ids, _ := json.Marshal(tok.Tokens)
	r = post(t, d.URL, "/detokenize", `{"model":"llama-8b","tokens":`+string(ids)+`}`)
	if r.Status != 200 || r.Body != `{"prompt":"Hello world"}` {
		t.Fatalf("detokenize: %d %s", r.Status, r.Body)
	}
	for _, tc := range []struct {
		path, body string
		status     int
	}{
		{"/tokenize", `{"model":"llama-8b"}`, 400},
		{"/tokenize", `{"model":"nope","prompt":"a"}`, 404},
		{"/detokenize", `{"model":"llama-8b","tokens":["a"]}`, 400},
		{"/detokenize", `{"model":"llama-8b","tokens":[99999999]}`, 400},
		{"/v1/tokenize", `{"model":"llama-8b","prompt":"a"}`, 404}, // vLLM has no /v1 form
	} {
		r := post(t, d.URL, tc.path, tc.body)
		errorBody(t, r.Body)
		if r.Status != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.path, tc.body, r.Status, r.Body, tc.status)
		}
	}
}

// In front of an embedding model on a vLLM server (the fake): the body
// reaches it untouched and its answer comes back whole; in front of a
// generative one, vLLM's own 400.
func TestEmbeddingsInFrontOfVLLM(t *testing.T) {
	t.Parallel()
	for _, pooling := range []bool{true, false} {
		t.Run("pooling="+strconv.FormatBool(pooling), func(t *testing.T) {
			f := fakevllm.New()
			f.Base, f.Pooling = []string{"embedder"}, pooling
			srv := httptest.NewServer(f)
			t.Cleanup(srv.Close)
			d := startDev(t, vllmEngine(srv.URL))
			body := `{"model":"embedder","input":["ab","cde"],"encoding_format":"base64","x_extra":{"k":1}}`
			r := post(t, d.URL, "/v1/embeddings", body)
			if !pooling {
				e := errorBody(t, r.Body)
				if r.Status != 400 || e.Message != "The model does not support Embeddings API" {
					t.Fatalf("%d %s", r.Status, r.Body)
				}
				return
			}
			var out struct {
				ID    string `json:"id"`
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if r.Status != 200 || json.Unmarshal([]byte(r.Body), &out) != nil || out.ID != "embd-fake" || out.Usage.PromptTokens != 5 {
				t.Fatalf("%d %s", r.Status, r.Body)
			}
			got := f.Received()
			if len(got) == 0 || string(got[len(got)-1].Body) != body {
				t.Fatalf("the engine got %v", got)
			}
		})
	}
}

// Limits and usage count embeddings: one request per input against RPM, and
// the inputs' prompt tokens (no completion tokens) in the key's usage.
func TestEmbeddingsLimitsAndUsage(t *testing.T) {
	t.Parallel()
	d, rd := limitsDev(t)
	keyID, secret := newKey(t, d, `{"name":"emb","tenant":"acme","rpm":4}`)
	auth := []string{"Authorization", "Bearer " + secret}
	awayFromMinuteEnd(t, rd)
	r := post(t, d.URL, "/v1/embeddings", `{"model":"llama-8b","input":["one two","three four five"]}`, auth...)
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if r.Status != 200 || json.Unmarshal([]byte(r.Body), &out) != nil || out.Usage.PromptTokens == 0 ||
		r.Header.Get("x-ratelimit-limit-requests") != "4" {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	// Two inputs counted, two left: three inputs are refused, two pass.
	if r := post(t, d.URL, "/v1/embeddings", `{"model":"llama-8b","input":["a","b","c"]}`, auth...); r.Status != 429 {
		t.Fatalf("three inputs over the rest of RPM 4: %d %s", r.Status, r.Body)
	}
	if r := post(t, d.URL, "/tokenize", `{"model":"llama-8b","prompt":"a"}`, auth...); r.Status != 200 {
		t.Fatalf("tokenize within RPM: %d %s", r.Status, r.Body)
	}
	if r := post(t, d.URL, "/tokenize", `{"model":"llama-8b","prompt":"a"}`, "Authorization", "Bearer tb-unknownunknownunknownunknownunknownunknown1"); r.Status != 401 {
		t.Fatalf("tokenize with an unknown key: %d %s", r.Status, r.Body)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		requests, prompt, completion := usageOf(t, d, keyID)
		if requests != 2 || prompt != int64(out.Usage.PromptTokens) || completion != 0 {
			return fmt.Errorf("usage: %d requests, %d prompt, %d completion tokens; want 2, %d, 0", requests, prompt, completion, out.Usage.PromptTokens)
		}
		return nil
	})
}

// A NATS-native client (what the Batch API will use) sends the new kinds
// through the standalone request subjects and the dispatcher: no chunk, a
// done frame with the whole answer; a bad body is the dispatcher's 400.
func TestEmbeddingsNATSClient(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	nc := connectNATS(t, d.NATSURL)
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(kind schemas.Kind, body string) (schemas.Frame, error) {
		st, err := cl.Start(&client.Request{ID: "nats-" + string(kind), Kind: kind, Model: "llama-8b", Body: []byte(body)})
		if err != nil {
			return schemas.Frame{}, err
		}
		defer st.Close()
		for {
			f, err := st.Next(ctx)
			if err != nil || f.Type == schemas.FrameDone {
				return f, err
			}
			if f.Type == schemas.FrameChunk {
				t.Errorf("%s: a chunk frame %s", kind, f.Payload)
			}
		}
	}
	f, err := run(schemas.KindEmbedding, `{"model":"llama-8b","input":["a","b"],"encoding_format":"base64"}`)
	var emb struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if err != nil || json.Unmarshal(f.Payload, &emb) != nil || len(emb.Data) != 2 || emb.Data[0].Embedding == "" {
		t.Fatalf("embedding: %v %s", err, f.Payload)
	}
	if f, err = run(schemas.KindDetokenize, `{"model":"llama-8b","tokens":[9906]}`); err != nil || string(f.Payload) != `{"prompt":"Hello"}` {
		t.Fatalf("detokenize: %v %s", err, f.Payload)
	}
	_, err = run(schemas.KindEmbedding, `{"model":"llama-8b","input":[]}`)
	var se *schemas.Error
	if !errors.As(err, &se) || se.Status != 400 || se.Body.Code == nil || *se.Body.Code != "empty_array" {
		t.Fatalf("empty input: %v", err)
	}
}

// A client that hangs up on an embeddings request frees the engine: the
// unary path cancels on disconnect as a stream:false chat does.
func TestEmbeddingsHangUpFreesEngine(t *testing.T) {
	t.Parallel()
	d := startDev(t, func(c *program.DevConfig) { c.Engine.Sim.PrefillBase = time.Hour })
	hb := watchHeartbeats(t, d.NATSURL)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/v1/embeddings", strings.NewReader(`{"model":"llama-8b","input":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if hb.running() != 1 {
			return fmt.Errorf("running %d, want 1", hb.running())
		}
		return nil
	})
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("an answer came, though the sim takes an hour")
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := hb.running(); n != 0 {
			return fmt.Errorf("the engine still runs %d requests", n)
		}
		return nil
	})
}
