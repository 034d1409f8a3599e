package enginetest

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// answer runs a request of a kind that does not generate: it must hand
// nothing to the sink and return the whole answer.
func answer(t *testing.T, e engine.Engine, kind schemas.Kind, model, body string) (*engine.Result, error) {
	t.Helper()
	req := rawRequest(kind, model, body)
	view, rerr := schemas.ReadRequest(kind, req.Body, model)
	if rerr != nil {
		t.Fatalf("enginetest: a request the suite makes is refused: %v\n%s", rerr, body)
	}
	req.View = view
	s := newSink()
	res, err := generate(t.Context(), e, req, s)
	if n := s.Calls(); n != 0 {
		t.Errorf("%s: %d Sink.Chunks calls, want none", kind, n)
	}
	if err == nil && (res == nil || len(res.Response) == 0) {
		t.Fatalf("%s: no response", kind)
	}
	return res, err
}

// testEmbeddings: an embeddings request is answered whole in OpenAI's shape
// (base64 as asked), with its prompt tokens as usage; tokenize and
// detokenize answer vLLM's shapes and undo each other; an unknown model is
// a 404.
func testEmbeddings(t *testing.T, h *Harness) {
	e := start(t, h)
	res, err := answer(t, e, schemas.KindEmbedding, h.Model, `{"model":"`+h.Model+`","input":["Say something.","Something else"],"encoding_format":"base64"}`)
	if err != nil {
		t.Fatal(err)
	}
	var emb struct {
		Object string `json:"object"`
		Data   []struct {
			Index     int    `json:"index"`
			Object    string `json:"object"`
			Embedding string `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(res.Response, &emb); err != nil || emb.Object != "list" || len(emb.Data) != 2 {
		t.Fatalf("embeddings answer: %v %s", err, res.Response)
	}
	size := -1
	for i, d := range emb.Data {
		raw, err := base64.StdEncoding.DecodeString(d.Embedding)
		if d.Index != i || d.Object != "embedding" || err != nil || len(raw) == 0 || len(raw)%4 != 0 || (size >= 0 && len(raw) != size) {
			t.Fatalf("data[%d]: index %d, object %q, %d bytes of base64 (%v)", i, d.Index, d.Object, len(raw), err)
		}
		size = len(raw)
	}
	if emb.Usage.PromptTokens <= 0 || emb.Usage.TotalTokens != emb.Usage.PromptTokens ||
		res.Usage.PromptTokens != emb.Usage.PromptTokens || res.Usage.CompletionTokens != 0 {
		t.Errorf("usage %+v, Result.Usage %+v", emb.Usage, res.Usage)
	}

	res, err = answer(t, e, schemas.KindTokenize, h.Model, `{"model":"`+h.Model+`","prompt":"Say something."}`)
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	if err := json.Unmarshal(res.Response, &tok); err != nil || tok.Count == 0 || tok.Count != len(tok.Tokens) || tok.MaxModelLen <= 0 {
		t.Fatalf("tokenize answer: %v %s", err, res.Response)
	}
	ids, _ := json.Marshal(tok.Tokens)
	res, err = answer(t, e, schemas.KindDetokenize, h.Model, `{"model":"`+h.Model+`","tokens":`+string(ids)+`}`)
	if err != nil {
		t.Fatal(err)
	}
	var detok struct {
		Prompt string `json:"prompt"`
	}
	if err := json.Unmarshal(res.Response, &detok); err != nil || detok.Prompt != "Say something." {
		t.Fatalf("detokenize answer: %v %s", err, res.Response)
	}

	const unknown = "enginetest-no-such-model"
	_, err = answer(t, e, schemas.KindEmbedding, unknown, `{"model":"`+unknown+`","input":"a"}`)
	if se := asError(t, err, 404); !strings.Contains(se.Body.Message, unknown) {
		t.Errorf("the 404 does not name the model: %v", se)
	}
}

// testNoPooling: a server without /v1/embeddings makes an embeddings
// request a 404 that says so (unsupported_endpoint), not a model not found.
func testNoPooling(t *testing.T, h *Harness) {
	e := start(t, h)
	_, err := answer(t, e, schemas.KindEmbedding, h.Model, `{"model":"`+h.Model+`","input":"x"}`)
	if se := asError(t, err, 404); code(se) != "unsupported_endpoint" {
		t.Fatalf("code %q, want unsupported_endpoint: %v", code(se), se)
	}
}
