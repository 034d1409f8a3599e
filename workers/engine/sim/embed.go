package sim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// The requests that answer one JSON object and generate nothing:
// embeddings, tokenize and detokenize. They bypass the scheduler (they hold
// no KV cache across steps): an embedding costs the time of a prefill of its
// tokens (PrefillBase + PrefillPerToken × tokens) and counts as running
// meanwhile; tokenize and detokenize cost nothing, as in vLLM, where they
// never reach the engine.

// DefaultEmbeddingDims is the sim's embedding size when Config.EmbeddingDims
// is 0 (that of small sentence-embedding models).
const DefaultEmbeddingDims = 384

// answer serves a request of a kind that does not generate.
func (e *Engine) answer(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	v, model, err := e.view(req)
	if err != nil {
		return nil, err
	}
	if _, _, err := e.resolve(model); err != nil {
		return nil, err
	}
	if model == "" {
		model = e.cur.Load().model
	}
	switch req.Kind {
	case schemas.KindEmbedding:
		return e.embed(ctx, req.ID, model, v)
	case schemas.KindTokenize:
		return e.tokenize(v)
	case schemas.KindDetokenize:
		return e.detokenize(v)
	}
	return nil, schemas.ErrUnknownKind.New(req.Kind)
}

// embedding is one item of an embeddings response; Embedding is a
// []float32 or, for base64, a string.
type embedding struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"`
}

// embed answers an embeddings request in OpenAI's shape (with vLLM's id and
// created): a deterministic unit vector per input (EmbedText).
func (e *Engine) embed(ctx context.Context, id, model string, v *schemas.Request) (*engine.Result, error) {
	dims := e.cfg.EmbeddingDims
	if v.Dimensions > dims {
		return nil, schemas.ErrAboveMax.At("dimensions", "dimensions", dims, v.Dimensions)
	}
	if v.Dimensions > 0 {
		dims = v.Dimensions
	}
	var texts []string
	var counts []int
	switch {
	case len(v.Messages) > 0:
		// vLLM's chat form: one input, the messages through the chat
		// template (counted as such); the sim embeds their text.
		texts = []string{messagesText(v.Messages)}
		counts = []int{len(e.chatIDs(v))}
	case v.Input.IsText():
		texts = v.Input.Texts()
		for _, t := range texts {
			counts = append(counts, len(encode(nil, t)))
		}
	default:
		for _, ids := range v.Input.TokenIDs() {
			ids64 := make([]int64, len(ids))
			for i, t := range ids {
				ids64[i] = int64(t)
			}
			text, err := e.Detokenize(ids64)
			if err != nil {
				return nil, schemas.ErrInvalidValue.At("input", "input", fmt.Sprintf("a token id is out of vocabulary (0..%d)", vocabSize-1))
			}
			texts = append(texts, text)
			counts = append(counts, len(ids))
		}
	}
	total := 0
	for _, n := range counts {
		if n > e.cfg.MaxModelLen {
			return nil, schemas.ErrContextLength.At("input", e.cfg.MaxModelLen,
				fmt.Sprintf("%d tokens in the input for embedding generation", n), "input")
		}
		total += n
	}

	// The simulated GPU time of a prefill of every input.
	e.nRunning.Add(1)
	err := sleepCtx(ctx, e.cfg.PrefillBase+time.Duration(total)*e.cfg.PrefillPerToken)
	e.nRunning.Add(-1)
	if err != nil {
		return nil, err
	}
	e.mPrompt.Add(uint64(total))

	data := make([]embedding, len(texts))
	for i, t := range texts {
		vec := EmbedText(t, e.cfg.EmbeddingDims)
		if dims < len(vec) { // OpenAI's text-embedding-3: the first dims, renormalised
			vec = normalize(vec[:dims])
		}
		data[i] = embedding{Index: i, Object: "embedding", Embedding: vec}
		if v.EncodingFormat == schemas.EncodingBase64 {
			data[i].Embedding = Base64(vec)
		}
	}
	body, merr := json.Marshal(struct {
		ID      string      `json:"id"`
		Object  string      `json:"object"`
		Created int64       `json:"created"`
		Model   string      `json:"model"`
		Data    []embedding `json:"data"`
		Usage   embedUsage  `json:"usage"`
	}{ID: "embd-" + e.responseID(id), Object: "list", Created: time.Now().Unix(), Model: model, Data: data,
		Usage: embedUsage{PromptTokens: total, TotalTokens: total}})
	if merr != nil {
		return nil, schemas.ErrInternal.New("encoding the embeddings: " + merr.Error())
	}
	return &engine.Result{Usage: schemas.Usage{PromptTokens: total, TotalTokens: total}, Response: body}, nil
}

// embedUsage is OpenAI's embeddings usage: no completion tokens.
type embedUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// responseID is the request's id, or a fresh one for a request without
// (a direct call).
func (e *Engine) responseID(id string) string {
	if id != "" {
		return id
	}
	return strconv.FormatUint(e.nextID.Add(1), 36)
}

// EmbedText is the sim's embedding of text: a dims-long unit vector,
// deterministic, in which texts that share words and word pieces are close
// (cosine) and unrelated texts nearly orthogonal. Its features are every
// word (lower-cased letters and digits), weighted 2, and every character
// trigram of each word padded with spaces (" cat", "cat ", ...), weighted 1,
// so that "cats" and "cat" are close too; text with no word has one feature,
// the whole text. Each feature adds its own pseudo-random direction (values
// in [-1, 1) drawn from a seed that is the feature's hash): a random
// projection of the bag of features, dense, so that a vector's first values
// alone (dimensions) keep the similarities, and EmbedText(t, n) is a prefix
// of EmbedText(t, m) for n < m before normalisation.
func EmbedText(text string, dims int) []float32 {
	if dims <= 0 {
		dims = DefaultEmbeddingDims
	}
	// Weights summed per feature first (a feature's direction costs dims
	// steps, and text repeats words and trigrams), in the order features
	// first appear: float sums in a map's random order would differ in the
	// last bits from one call to the next.
	type feature struct {
		hash   uint64
		weight float64
	}
	var feats []feature
	index := make(map[uint64]int, 64)
	add := func(name string, w float64) {
		h := schemas.StringHash(name)
		if i, ok := index[h]; ok {
			feats[i].weight += w
			return
		}
		index[h] = len(feats)
		feats = append(feats, feature{h, w})
	}
	words := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	for _, w := range words {
		add("w:"+w, 2)
		padded := []rune(" " + w + " ")
		for i := 0; i+3 <= len(padded); i++ {
			add("t:"+string(padded[i:i+3]), 1)
		}
	}
	if len(words) == 0 {
		add("s:"+text, 1)
	}
	acc := make([]float64, dims)
	for _, f := range feats {
		state, w := f.hash, f.weight
		for i := range acc {
			state += 0x9e3779b97f4a7c15                                   // SplitMix64: a Weyl sequence, mixed
			acc[i] += w * (float64(schemas.Mix64(state)>>11)/(1<<52) - 1) // [-1, 1)
		}
	}
	out := make([]float32, dims)
	for i, x := range acc {
		out[i] = float32(x)
	}
	return normalize(out)
}

// normalize scales v to unit L2 norm in place (a zero vector stays zero).
func normalize(v []float32) []float32 {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return v
	}
	inv := 1 / math.Sqrt(sum)
	for i, x := range v {
		v[i] = float32(float64(x) * inv)
	}
	return v
}

// Base64 is OpenAI's base64 encoding of an embedding: its float32 values as
// little-endian bytes, which the SDKs decode (numpy's frombuffer, float32).
func Base64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// chatIDs are the tokens of a request's messages as /tokenize and the
// chat form of embeddings count them: the chat template, with
// add_generation_prompt and continue_final_message.
func (e *Engine) chatIDs(v *schemas.Request) []uint32 {
	if v.ContinueFinalMessage {
		return chatTemplate(v.Messages, true)
	}
	return e.TokenizeChat(v.Messages, v.AddGenerationPrompt)
}

// messagesText is what the chat form of embeddings embeds: the messages'
// texts, a line each.
func messagesText(msgs []schemas.Message) string {
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = m.Text()
	}
	return strings.Join(parts, "\n")
}

// tokenize answers vLLM's /tokenize: {count, max_model_len, tokens,
// token_strs} (token_strs null unless return_token_strs).
func (e *Engine) tokenize(v *schemas.Request) (*engine.Result, error) {
	var ids []uint32
	switch {
	case len(v.Messages) > 0:
		ids = e.chatIDs(v)
	default:
		texts := v.Prompt.Texts()
		if len(texts) > 0 {
			ids = e.TokenizePrompt(texts[0])
		}
	}
	if ids == nil {
		ids = []uint32{}
	}
	resp := struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []uint32  `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}{Count: len(ids), MaxModelLen: e.cfg.MaxModelLen, Tokens: ids}
	if v.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i], _ = e.Detokenize([]int64{int64(id)})
		}
		resp.TokenStrs = &strs
	}
	body, err := json.Marshal(resp)
	if err != nil {
		return nil, schemas.ErrInternal.New("encoding the tokens: " + err.Error())
	}
	return &engine.Result{Response: body}, nil
}

// detokenize answers vLLM's /detokenize: {prompt}.
func (e *Engine) detokenize(v *schemas.Request) (*engine.Result, error) {
	ids := make([]int64, len(v.Tokens))
	for i, t := range v.Tokens {
		ids[i] = int64(t)
	}
	text, err := e.Detokenize(ids)
	if err != nil {
		return nil, err
	}
	body, merr := json.Marshal(struct {
		Prompt string `json:"prompt"`
	}{text})
	if merr != nil {
		return nil, schemas.ErrInternal.New("encoding the text: " + merr.Error())
	}
	return &engine.Result{Response: body}, nil
}
