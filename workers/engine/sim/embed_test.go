package sim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

type embedResp struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int             `json:"index"`
		Object    string          `json:"object"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage map[string]int `json:"usage"`
}

func embedOf(t *testing.T, e *Engine, body string) (embedResp, *engine.Result) {
	t.Helper()
	res := mustGen(t, e, schemas.KindEmbedding, body, &recSink{})
	var r embedResp
	if err := json.Unmarshal(res.Response, &r); err != nil {
		t.Fatalf("%s: %v", res.Response, err)
	}
	return r, res
}

func vectors(t *testing.T, r embedResp) [][]float32 {
	t.Helper()
	var out [][]float32
	for _, d := range r.Data {
		var v []float32
		if len(d.Embedding) > 0 && d.Embedding[0] == '"' {
			var s string
			_ = json.Unmarshal(d.Embedding, &s)
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(b)%4 != 0 {
				t.Fatalf("base64 embedding: %v (%d bytes)", err, len(b))
			}
			for i := 0; i < len(b); i += 4 {
				v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
			}
		} else if err := json.Unmarshal(d.Embedding, &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func cosine(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

func norm(a []float32) float64 { return math.Sqrt(cosine(a, a)) }

func TestEmbeddings(t *testing.T) {
	e := newEngine(t, fastConfig())
	r, res := embedOf(t, e, `{"model":"sim","input":["The cat sat on the mat.","A cat was sitting on a mat","Quarterly revenue grew by 4 percent","The cat sat on the mat."]}`)
	if r.Object != "list" || r.Model != "sim" || r.ID != "embd-req1" || len(r.Data) != 4 {
		t.Fatalf("response %+v", r)
	}
	for i, d := range r.Data {
		if d.Index != i || d.Object != "embedding" {
			t.Errorf("data[%d] = index %d object %q", i, d.Index, d.Object)
		}
	}
	v := vectors(t, r)
	for i, x := range v {
		if len(x) != DefaultEmbeddingDims {
			t.Errorf("vector %d has %d dims", i, len(x))
		}
		if n := norm(x); math.Abs(n-1) > 1e-5 {
			t.Errorf("vector %d has norm %v", i, n)
		}
	}
	for i := range v[0] { // bit for bit: no order-dependent float sums
		if v[0][i] != v[3][i] {
			t.Fatalf("the same text, value %d: %v and %v", i, v[0][i], v[3][i])
		}
	}
	similar, unrelated := cosine(v[0], v[1]), cosine(v[0], v[2])
	t.Logf("cosine: similar %.3f, unrelated %.3f", similar, unrelated)
	if similar < 0.3 || similar <= unrelated+0.2 {
		t.Errorf("cosine similar %v, unrelated %v: similar texts must be clearly closer", similar, unrelated)
	}
	// usage: the prompt tokens of every input, and nothing generated
	want := 0
	for _, s := range []string{"The cat sat on the mat.", "A cat was sitting on a mat", "Quarterly revenue grew by 4 percent", "The cat sat on the mat."} {
		want += len(e.TokenizePrompt(s))
	}
	if res.Usage.PromptTokens != want || res.Usage.TotalTokens != want || res.Usage.CompletionTokens != 0 {
		t.Errorf("Result.Usage %+v, want %d prompt tokens", res.Usage, want)
	}
	if r.Usage["prompt_tokens"] != want || r.Usage["total_tokens"] != want || len(r.Usage) != 2 {
		t.Errorf("usage %v, want prompt_tokens = total_tokens = %d", r.Usage, want)
	}

	// Deterministic across requests and engines; token ids embed as their text.
	e2 := newEngine(t, fastConfig())
	ids := e.TokenizePrompt("The cat sat on the mat.")
	idsJSON, _ := json.Marshal(ids)
	r2, _ := embedOf(t, e2, `{"model":"sim","input":`+string(idsJSON)+`}`)
	if c := cosine(v[0], vectors(t, r2)[0]); math.Abs(c-1) > 1e-6 {
		t.Errorf("the text's token ids, cosine %v with the text", c)
	}
}

func TestEmbeddingFormats(t *testing.T) {
	e := newEngine(t, fastConfig())
	rf, _ := embedOf(t, e, `{"model":"sim","input":"hello there"}`)
	rb, _ := embedOf(t, e, `{"model":"sim","input":"hello there","encoding_format":"base64"}`)
	if rb.Data[0].Embedding[0] != '"' {
		t.Fatalf("base64 gave %s", rb.Data[0].Embedding[:20])
	}
	f, b := vectors(t, rf)[0], vectors(t, rb)[0]
	for i := range f {
		if f[i] != b[i] {
			t.Fatalf("float and base64 differ at %d: %v, %v", i, f[i], b[i])
		}
	}
	// Shortened vectors keep the similarities.
	rs, _ := embedOf(t, e, `{"model":"sim","input":["The cat sat on the mat.","A cat was sitting on a mat","Quarterly revenue grew by 4 percent"],"dimensions":32}`)
	s := vectors(t, rs)
	if similar, unrelated := cosine(s[0], s[1]), cosine(s[0], s[2]); len(s[0]) != 32 || similar <= unrelated+0.2 {
		t.Errorf("dimensions 32: cosine similar %v, unrelated %v", similar, unrelated)
	}
	rd, _ := embedOf(t, e, `{"model":"sim","input":"hello there","dimensions":64}`)
	d := vectors(t, rd)[0]
	if len(d) != 64 || math.Abs(norm(d)-1) > 1e-5 {
		t.Fatalf("dimensions 64: %d dims, norm %v", len(d), norm(d))
	}
	// OpenAI's shortening: the first values, renormalised
	scale := d[0] / f[0]
	for i := range d {
		if math.Abs(float64(d[i]-f[i]*scale)) > 1e-5 {
			t.Fatalf("dimensions is not a renormalised prefix at %d", i)
		}
	}
}

func TestEmbeddingErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 16
	cfg.NumBlocks = 64
	e := newEngine(t, cfg)
	for _, tc := range []struct {
		name, body, code string
		status           int
	}{
		{"too many dimensions", `{"model":"sim","input":"a","dimensions":385}`, "integer_above_max_value", 400},
		{"over the context", `{"model":"sim","input":"` + long(40) + `"}`, "context_length_exceeded", 400},
		{"token out of vocabulary", `{"model":"sim","input":[1,200000]}`, "invalid_value", 400},
		{"unknown model", `{"model":"nope","input":"a"}`, "model_not_found", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gen(t, e, schemas.KindEmbedding, tc.body, &recSink{})
			se := schemas.AsError(err)
			if err == nil || se.Status != tc.status || se.Body.Code == nil || *se.Body.Code != tc.code {
				t.Fatalf("error %v, want %d %s", err, tc.status, tc.code)
			}
		})
	}
}

func long(words int) string {
	s := ""
	for range words {
		s += "word "
	}
	return s
}

// An embedding takes the simulated time of its prefill, counts as running
// meanwhile, and ends with its context.
func TestEmbeddingTakesPrefillTime(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillBase = time.Hour
	e := newEngine(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.Generate(ctx, &engine.Request{ID: "r", Kind: schemas.KindEmbedding, Body: []byte(`{"model":"sim","input":"a"}`)}, &recSink{})
		errc <- err
	}()
	wantStats(t, e, func(s engine.Stats) bool { return s.Running == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("no error after cancel")
	}
	wantStats(t, e, func(s engine.Stats) bool { return s.Running == 0 })
}

func TestTokenizeDetokenizeKinds(t *testing.T) {
	e := newEngine(t, fastConfig())
	res := mustGen(t, e, schemas.KindTokenize, `{"model":"sim","prompt":"Hello world","return_token_strs":true}`, &recSink{})
	var tr struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []int64   `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}
	if err := json.Unmarshal(res.Response, &tr); err != nil {
		t.Fatal(err)
	}
	want := e.TokenizePrompt("Hello world")
	if tr.Count != len(want) || len(tr.Tokens) != len(want) || tr.MaxModelLen != e.cfg.MaxModelLen ||
		tr.TokenStrs == nil || len(*tr.TokenStrs) != len(want) || (*tr.TokenStrs)[0] != "Hello" {
		t.Fatalf("tokenize: %s", res.Response)
	}
	res = mustGen(t, e, schemas.KindTokenize, `{"model":"sim","messages":[{"role":"user","content":"hi"}]}`, &recSink{})
	var chat struct {
		Count     int       `json:"count"`
		TokenStrs *[]string `json:"token_strs"`
	}
	_ = json.Unmarshal(res.Response, &chat)
	msgs, _ := schemas.ReadMessages([]byte(`[{"role":"user","content":"hi"}]`))
	if chat.Count != len(e.TokenizeChat(msgs, true)) || chat.TokenStrs != nil {
		t.Fatalf("tokenize messages: %s", res.Response)
	}

	ids, _ := json.Marshal(tr.Tokens)
	res = mustGen(t, e, schemas.KindDetokenize, `{"model":"sim","tokens":`+string(ids)+`}`, &recSink{})
	if string(res.Response) != `{"prompt":"Hello world"}` {
		t.Fatalf("detokenize: %s", res.Response)
	}
	_, err := gen(t, e, schemas.KindDetokenize, `{"model":"sim","tokens":[999999]}`, &recSink{})
	if se := schemas.AsError(err); err == nil || se.Status != 400 {
		t.Fatalf("out-of-vocabulary detokenize: %v", err)
	}
}

// BenchmarkEmbedText: the sim's cost per input of 512 words (about 512
// tokens), on top of the simulated prefill time.
func BenchmarkEmbedText(b *testing.B) {
	text := long(0)
	for i := range 512 {
		text += words[i%len(words)]
	}
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		EmbedText(text, DefaultEmbeddingDims)
	}
}

// vLLM's chat form: messages instead of input embed the messages' text (a
// line each) as one input, its tokens counted through the chat template.
func TestChatEmbeddings(t *testing.T) {
	e := newEngine(t, fastConfig())
	msgs := `[{"role":"system","content":"You sort fruit."},{"role":"user","content":[{"type":"text","text":"apple banana"}]}]`
	r, res := embedOf(t, e, `{"model":"sim","messages":`+msgs+`,"dimensions":64}`)
	if len(r.Data) != 1 || r.Object != "list" {
		t.Fatalf("%+v", r)
	}
	want := normalize(EmbedText("You sort fruit.\napple banana", e.cfg.EmbeddingDims)[:64])
	got := vectors(t, r)[0]
	if len(got) != 64 || math.Abs(cosine(got, want)-1) > 1e-6 {
		t.Errorf("not the embedding of the messages' text: cosine %v", cosine(got, want))
	}
	parsed, rerr := schemas.ReadMessages([]byte(msgs))
	if rerr != nil {
		t.Fatal(rerr)
	}
	// vLLM's default for embeddings: no generation prompt.
	tokens := len(e.TokenizeChat(parsed, false))
	if r.Usage["prompt_tokens"] != tokens || res.Usage.PromptTokens != tokens {
		t.Errorf("usage %v, want %d prompt tokens", r.Usage, tokens)
	}
	r, _ = embedOf(t, e, `{"model":"sim","messages":`+msgs+`,"add_generation_prompt":true}`)
	if r.Usage["prompt_tokens"] != len(e.TokenizeChat(parsed, true)) {
		t.Errorf("with the generation prompt: usage %v", r.Usage)
	}
	_, err := gen(t, e, schemas.KindEmbedding, `{"model":"sim","messages":`+msgs+`,"input":"x"}`, &recSink{})
	if err == nil || *asError(t, err).Body.Param != "messages" {
		t.Errorf("input and messages: %v", err)
	}
}
