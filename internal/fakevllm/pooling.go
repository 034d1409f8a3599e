package fakevllm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// FakeMaxModelLen is the max_model_len /tokenize reports.
const FakeMaxModelLen = 4096

// record keeps a request as Received lists it; it returns its id.
func (s *Server) record(r *http.Request, body []byte) string {
	id := r.Header.Get("X-Request-Id")
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "" {
		id = fmt.Sprintf("fake-%d", len(s.received)+1)
	}
	s.byID[id] = len(s.received)
	s.received = append(s.received, Request{ID: id, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	return id
}

// embeddings is POST /v1/embeddings. A fake with Pooling false serves a
// generative model and answers as vLLM does then (400, "The model does
// not support Embeddings API"); else each input's embedding is
// [len(text or ids), index, 0, 1] normalised, and usage counts a token per
// byte of text (or per id).
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.record(r, body)
	if !s.Pooling {
		writeError(w, http.StatusBadRequest, "BadRequestError", "The model does not support Embeddings API", nil)
		return
	}
	view, ok := s.readView(w, schemas.KindEmbedding, body)
	if !ok {
		return
	}
	var lens []int
	if view.Input.IsText() {
		for _, t := range view.Input.Texts() {
			lens = append(lens, len(t))
		}
	} else {
		for _, ids := range view.Input.TokenIDs() {
			lens = append(lens, len(ids))
		}
	}
	type item struct {
		Index     int    `json:"index"`
		Object    string `json:"object"`
		Embedding any    `json:"embedding"`
	}
	data := make([]item, len(lens))
	total := 0
	for i, n := range lens {
		total += n
		v := []float32{float32(n), float32(i), 0, 1}
		var sum float64
		for _, x := range v {
			sum += float64(x * x)
		}
		for j := range v {
			v[j] = float32(float64(v[j]) / math.Sqrt(sum))
		}
		data[i] = item{Index: i, Object: "embedding", Embedding: v}
		if view.EncodingFormat == schemas.EncodingBase64 {
			b := make([]byte, 4*len(v))
			for j, x := range v {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
			}
			data[i].Embedding = base64.StdEncoding.EncodeToString(b)
		}
	}
	out, _ := json.Marshal(map[string]any{"id": "embd-fake", "object": "list", "created": time.Now().Unix(), "model": view.Model,
		"data": data, "usage": map[string]any{"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0, "prompt_tokens_details": nil}})
	writeJSON(w, 200, string(out))
}

// tokenize is POST /tokenize: a token per byte of the prompt (or of each
// message's text), its id the byte.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.record(r, body)
	view, ok := s.readView(w, schemas.KindTokenize, body)
	if !ok {
		return
	}
	var text string
	if ps := view.Prompt.Texts(); len(ps) > 0 {
		text = ps[0]
	}
	for _, m := range view.Messages {
		text += m.Text()
	}
	ids := make([]int, len(text))
	strs := make([]string, len(text))
	for i := range len(text) {
		ids[i], strs[i] = int(text[i]), text[i:i+1]
	}
	resp := map[string]any{"count": len(ids), "max_model_len": FakeMaxModelLen, "tokens": ids, "token_strs": nil}
	if view.ReturnTokenStrs {
		resp["token_strs"] = strs
	}
	out, _ := json.Marshal(resp)
	writeJSON(w, 200, string(out))
}

// detokenize is POST /detokenize: each id is a byte.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.record(r, body)
	view, ok := s.readView(w, schemas.KindDetokenize, body)
	if !ok {
		return
	}
	b := make([]byte, len(view.Tokens))
	for i, t := range view.Tokens {
		b[i] = byte(t)
	}
	out, _ := json.Marshal(map[string]string{"prompt": string(b)})
	writeJSON(w, 200, string(out))
}

// known answers vLLM's 404 for a model it does not serve.
func (s *Server) known(w http.ResponseWriter, model string) bool {
	if s.AnyModel || s.IsBase(model) || s.isLoaded(model) {
		return true
	}
	param := "model"
	writeError(w, 404, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model), &param)
	return false
}

// readView reads body as vLLM would a request of kind for a model it serves,
// answering its 400 or 404 itself (ok false).
func (s *Server) readView(w http.ResponseWriter, kind schemas.Kind, body []byte) (*schemas.Request, bool) {
	view, rerr := schemas.ReadRequest(kind, body, s.Base[0])
	if rerr != nil {
		writeError(w, rerr.Status, "BadRequestError", rerr.Body.Message, rerr.Body.Param)
		return nil, false
	}
	return view, s.known(w, view.Model)
}
