package httpengine

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Embeddings, tokenize and detokenize are forwarded to the engine's
// endpoints byte for byte, and its answer is the whole response.
func TestForwardNonGenerating(t *testing.T) {
	f := fakevllm.New()
	f.Pooling = true
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	e := newEngine(t, fastConfig(srv.URL))
	healthy(t, e)
	for _, tc := range []struct {
		kind        schemas.Kind
		body, path  string
		check       func(t *testing.T, resp []byte)
		promptUsage int
	}{
		{schemas.KindEmbedding, `{"model":"base","input":["ab","cde"],"encoding_format":"base64","x_extra":1}`, "/v1/embeddings",
			func(t *testing.T, resp []byte) {
				var r struct {
					Object string `json:"object"`
					Data   []struct {
						Index     int    `json:"index"`
						Embedding string `json:"embedding"`
					} `json:"data"`
				}
				if json.Unmarshal(resp, &r) != nil || r.Object != "list" || len(r.Data) != 2 || r.Data[1].Index != 1 || r.Data[0].Embedding == "" {
					t.Fatalf("embeddings answer %s", resp)
				}
			}, 5},
		{schemas.KindTokenize, `{"model":"base","prompt":"hi","return_token_strs":true}`, "/tokenize",
			func(t *testing.T, resp []byte) {
				if string(resp) != `{"count":2,"max_model_len":4096,"token_strs":["h","i"],"tokens":[104,105]}` {
					t.Fatalf("tokenize answer %s", resp)
				}
			}, 0},
		{schemas.KindDetokenize, `{"model":"base","tokens":[104,105]}`, "/detokenize",
			func(t *testing.T, resp []byte) {
				if string(resp) != `{"prompt":"hi"}` {
					t.Fatalf("detokenize answer %s", resp)
				}
			}, 0},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			id := "id-" + string(tc.kind)
			res, err := e.Generate(t.Context(), &engine.Request{ID: id, Kind: tc.kind, Model: "base", Body: []byte(tc.body)}, &nopSink{})
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, res.Response)
			if res.Usage.PromptTokens != tc.promptUsage || res.Usage.CompletionTokens != 0 {
				t.Errorf("usage %+v, want %d prompt tokens", res.Usage, tc.promptUsage)
			}
			got := f.Received()
			last := got[len(got)-1]
			if last.Path != tc.path || string(last.Body) != tc.body || last.ID != id {
				t.Errorf("the fake got %s %s (id %s), want %s %s", last.Path, last.Body, last.ID, tc.path, tc.body)
			}
		})
	}
}

func TestForwardNonGeneratingErrors(t *testing.T) {
	f := fakevllm.New() // a generative model, as vLLM serves one
	f.NoTokenize = true // and no /tokenize, as a strict OpenAI-compatible server
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	e := newEngine(t, fastConfig(srv.URL))
	healthy(t, e)
	for _, tc := range []struct {
		name   string
		kind   schemas.Kind
		body   string
		status int
		code   string
		msg    string
	}{
		{"embeddings of a generative model", schemas.KindEmbedding, `{"model":"base","input":"a"}`, 400, "", "The model does not support Embeddings API"},
		{"no /tokenize", schemas.KindTokenize, `{"model":"base","prompt":"a"}`, 404, "unsupported_endpoint", "The test engine behind this model does not serve /tokenize."},
		{"no /detokenize", schemas.KindDetokenize, `{"model":"base","tokens":[1]}`, 404, "unsupported_endpoint", "The test engine behind this model does not serve /detokenize."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Generate(t.Context(), &engine.Request{ID: "x", Kind: tc.kind, Model: "base", Body: []byte(tc.body)}, &nopSink{})
			se := schemas.AsError(err)
			code := ""
			if se.Body.Code != nil {
				code = *se.Body.Code
			}
			if err == nil || se.Status != tc.status || code != tc.code || se.Body.Message != tc.msg || se.Body.Type != schemas.TypeInvalidRequest {
				t.Fatalf("error %v (%s), want %d %q %q", err, se.JSON(), tc.status, tc.code, tc.msg)
			}
		})
	}
	// A model the server does not have is still its 404, not a missing route.
	f2 := fakevllm.New()
	f2.Pooling = true
	srv2 := httptest.NewServer(f2)
	t.Cleanup(srv2.Close)
	e2 := newEngine(t, fastConfig(srv2.URL))
	healthy(t, e2)
	_, err := e2.Generate(t.Context(), &engine.Request{ID: "y", Kind: schemas.KindEmbedding, Model: "other", Body: []byte(`{"model":"other","input":"a"}`)}, &nopSink{})
	if se := schemas.AsError(err); err == nil || se.Status != 404 || se.Body.Message != "The model `other` does not exist." {
		t.Fatalf("unknown model: %v", err)
	}
}
