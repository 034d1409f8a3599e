package simserver

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

type modelList struct {
	Object string `json:"object"`
	Data   []struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        *string `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
		Permission  []struct {
			Object string `json:"object"`
		} `json:"permission"`
	} `json:"data"`
}

func models(t *testing.T, ts *testServer) modelList {
	t.Helper()
	resp := do(t, http.MethodGet, ts.url+"/v1/models", "")
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/models: %d", resp.StatusCode)
	}
	return decode[modelList](t, readAll(t, resp))
}

func str(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

func TestModelsAndLoRA(t *testing.T) {
	sc := fastSim()
	sc.ServedNames = []string{"base-alias"}
	sc.MaxLoras = 2
	ts := start(t, Config{AllowRuntimeLoRA: true, Root: "/models/base"}, sc)

	list := models(t, ts)
	if list.Object != "list" || len(list.Data) != 2 {
		t.Fatalf("models %+v", list)
	}
	for i, id := range []string{"base", "base-alias"} {
		m := list.Data[i]
		if m.ID != id || m.Object != "model" || m.OwnedBy != "vllm" || str(m.Root) != "/models/base" || m.Parent != nil ||
			m.MaxModelLen == nil || *m.MaxModelLen != 8192 || m.Created == 0 || len(m.Permission) != 1 ||
			m.Permission[0].Object != "model_permission" {
			t.Errorf("model %d: %+v", i, m)
		}
	}

	lora := func(path, body string) (int, string) {
		resp := do(t, http.MethodPost, ts.url+path, body)
		return resp.StatusCode, string(readAll(t, resp))
	}
	for _, step := range []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"load", "/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`, 200, "Success: LoRA adapter 'sql' added successfully."},
		{"already loaded", "/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`, 400, "The lora adapter 'sql' has already been loaded."},
		{"no path", "/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "Both 'lora_name' and 'lora_path' must be provided."},
		{"base name", "/v1/load_lora_adapter", `{"lora_name":"base","lora_path":"/x"}`, 400, "is the base model"},
		{"load a second", "/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/adapters/chat"}`, 200, "Success: LoRA adapter 'chat' added successfully."},
		{"no free slot", "/v1/load_lora_adapter", `{"lora_name":"third","lora_path":"/adapters/third"}`, 400, "all 2 LoRA slots (max_loras) are in use"},
		{"unload", "/v1/unload_lora_adapter", `{"lora_name":"chat"}`, 200, "Success: LoRA adapter 'chat' removed successfully."},
		{"unload again", "/v1/unload_lora_adapter", `{"lora_name":"chat"}`, 404, "The lora adapter 'chat' cannot be found."},
		{"unload no name", "/v1/unload_lora_adapter", `{}`, 400, "either 'lora_name' and 'lora_int_id' needs to be provided."},
		{"bad JSON", "/v1/unload_lora_adapter", `{`, 400, "invalid request body"},
	} {
		status, body := lora(step.path, step.body)
		if status != step.status || !strings.Contains(body, step.want) {
			t.Errorf("%s: %d %s, want %d ~%q", step.name, status, body, step.status, step.want)
		}
		if status == 200 && body != step.want {
			t.Errorf("%s: body %q, want exactly %q", step.name, body, step.want)
		}
	}

	list = models(t, ts)
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, []string{"base", "base-alias", "sql"}) {
		t.Fatalf("models %v", ids)
	}
	if m := list.Data[2]; str(m.Parent) != "base" || str(m.Root) != "/adapters/sql" || m.MaxModelLen != nil {
		t.Errorf("adapter card %+v", m)
	}

	resp := do(t, http.MethodPost, ts.url+"/v1/completions", `{"model":"sql","prompt":"SELECT","max_tokens":3}`)
	if r := decode[response](t, readAll(t, resp)); resp.StatusCode != 200 || r.Model != "sql" {
		t.Errorf("generate on the adapter: %d %+v", resp.StatusCode, r)
	}
}

func TestTokenize(t *testing.T) {
	sc := fastSim()
	ts := start(t, Config{}, sc)
	msgs := `[{"role":"system","content":"You are terse."},{"role":"user","content":"What is the capital of France?"}]`
	prompt := "The capital of France is"
	for _, tc := range []struct {
		name, tokenize, path, generate string
	}{
		{"chat", `{"model":"base","messages":` + msgs + `}`, "/v1/chat/completions", `{"model":"base","max_tokens":2,"messages":` + msgs + `}`},
		{"completion", `{"model":"base","prompt":"` + prompt + `"}`, "/v1/completions", `{"model":"base","max_tokens":2,"prompt":"` + prompt + `"}`},
		{"no model", `{"prompt":"` + prompt + `"}`, "/v1/completions", `{"max_tokens":2,"prompt":"` + prompt + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(t, http.MethodPost, ts.url+"/tokenize", tc.tokenize)
			tok := decode[struct {
				Count       int       `json:"count"`
				MaxModelLen int       `json:"max_model_len"`
				Tokens      []int64   `json:"tokens"`
				TokenStrs   *[]string `json:"token_strs"`
			}](t, readAll(t, resp))
			if resp.StatusCode != 200 || tok.Count == 0 || tok.Count != len(tok.Tokens) || tok.MaxModelLen != 8192 || tok.TokenStrs != nil {
				t.Fatalf("/tokenize: %d %+v", resp.StatusCode, tok)
			}
			resp = do(t, http.MethodPost, ts.url+tc.path, tc.generate)
			if r := decode[response](t, readAll(t, resp)); r.Usage == nil || r.Usage.PromptTokens != tok.Count {
				t.Errorf("usage %+v, /tokenize count %d", r.Usage, tok.Count)
			}
		})
	}

	post := func(path, body string) (int, string) {
		resp := do(t, http.MethodPost, ts.url+path, body)
		return resp.StatusCode, string(readAll(t, resp))
	}
	if status, body := post("/tokenize", `{"prompt":"Hello world","return_token_strs":true}`); status != 200 ||
		!strings.Contains(body, `"token_strs":["Hello"," world"]`) {
		t.Errorf("return_token_strs: %d %s", status, body)
	}
	if status, body := post("/tokenize", `{"messages":`+msgs+`,"add_generation_prompt":false,"return_token_strs":true}`); status != 200 ||
		strings.Contains(body, `"assistant"`) {
		t.Errorf("add_generation_prompt false: %d %s", status, body)
	}
	if status, body := post("/detokenize", `{"model":"base","tokens":[9906,1917]}`); status != 200 || body != `{"prompt":"Hello world"}` {
		t.Errorf("/detokenize: %d %s", status, body)
	}
	for _, bad := range []struct {
		path, body string
		status     int
	}{
		{"/tokenize", `{"model":"nope","prompt":"x"}`, 404},
		{"/tokenize", `{"model":"base"}`, 400},
		{"/tokenize", `{"messages":[]}`, 400},
		{"/detokenize", `{"tokens":[-5]}`, 400},
	} {
		if status, body := post(bad.path, bad.body); status != bad.status || !strings.Contains(body, `"error":{`) {
			t.Errorf("%s %s: %d %s, want %d", bad.path, bad.body, status, body, bad.status)
		}
	}
}

func TestEmbeddings(t *testing.T) {
	ts := start(t, Config{}, fastSim())
	resp := do(t, http.MethodPost, ts.url+"/v1/embeddings", `{"model":"base","input":["a cat","a cat"],"dimensions":8}`)
	r := decode[struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}](t, readAll(t, resp))
	if resp.StatusCode != 200 || r.Object != "list" || r.Model != "base" || len(r.Data) != 2 || len(r.Data[1].Embedding) != 8 ||
		r.Data[1].Index != 1 || r.Usage.PromptTokens != 4 {
		t.Fatalf("%d %+v", resp.StatusCode, r)
	}
	for i := range r.Data[0].Embedding {
		if r.Data[0].Embedding[i] != r.Data[1].Embedding[i] {
			t.Fatal("the same input gave two embeddings")
		}
	}
	// vLLM's chat form: messages instead of input, one embedding.
	resp = do(t, http.MethodPost, ts.url+"/v1/embeddings", `{"model":"base","messages":[{"role":"user","content":"a cat"}],"dimensions":8}`)
	if b := readAll(t, resp); resp.StatusCode != 200 || strings.Count(string(b), `"embedding":[`) != 1 {
		t.Fatalf("chat form: %d %s", resp.StatusCode, b)
	}
	for _, tc := range []struct {
		body   string
		status int
	}{
		{`{"model":"base","input":"a","messages":[{"role":"user","content":"a"}]}`, 400},
		{`{"model":"nope","input":"a"}`, 404},
		{`{"model":"base","input":[]}`, 400},
		{`{"model":"base","input":"a","encoding_format":"int8"}`, 400},
	} {
		resp := do(t, http.MethodPost, ts.url+"/v1/embeddings", tc.body)
		if b := readAll(t, resp); resp.StatusCode != tc.status || !strings.Contains(string(b), `"error"`) {
			t.Errorf("%s: %d %s", tc.body, resp.StatusCode, b)
		}
	}
}
