package simserver

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// modelCard is vLLM's ModelCard, fields in its order.
type modelCard struct {
	ID          string       `json:"id"`
	Object      string       `json:"object"`
	Created     int64        `json:"created"`
	OwnedBy     string       `json:"owned_by"`
	Root        *string      `json:"root"`
	Parent      *string      `json:"parent"`
	MaxModelLen *int         `json:"max_model_len"`
	Permission  []permission `json:"permission"`
}

type permission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func card(id string, now int64, root, parent *string, maxLen *int) modelCard {
	return modelCard{ID: id, Object: "model", Created: now, OwnedBy: "vllm", Root: root, Parent: parent, MaxModelLen: maxLen,
		Permission: []permission{{ID: "modelperm-" + randomHex(), Object: "model_permission", Created: now,
			AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}}}
}

// serveModels is GET /v1/models: the base names, then the adapters (sorted)
// with their base model as parent and their path as root.
func (s *Server) serveModels(w http.ResponseWriter) {
	now := time.Now().Unix()
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	list.Object = "list"
	maxLen := s.maxLen
	for _, n := range s.names {
		list.Data = append(list.Data, card(n, now, &s.cfg.Root, nil, &maxLen))
	}
	adapters := s.eng.Adapters()
	names := make([]string, 0, len(adapters))
	for n := range adapters {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		path := adapters[n]
		list.Data = append(list.Data, card(n, now, &path, &s.model, nil))
	}
	writeJSON(w, http.StatusOK, list)
}

// decodeBody reads a small JSON control body into v; false after answering.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if !s.jsonContent(w, r) {
		return false
	}
	bp, ok := s.readBody(w, r)
	if !ok {
		return false
	}
	defer s.putBody(bp)
	if err := json.Unmarshal(*bp, v); err != nil {
		s.writeError(w, newError(http.StatusBadRequest, "", "invalid request body: "+err.Error()))
		return false
	}
	return true
}

func writeText(w http.ResponseWriter, msg string) {
	writeRaw(w, http.StatusOK, "text/plain; charset=utf-8", []byte(msg))
}

// serveLoadLoRA is POST /v1/load_lora_adapter {lora_name, lora_path}.
func (s *Server) serveLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if !s.decodeBody(w, r, &req) {
		return
	}
	if req.Name == "" || req.Path == "" {
		s.writeError(w, newError(http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	if err := s.eng.LoadAdapter(r.Context(), req.Name, req.Path); err != nil {
		switch {
		case r.Context().Err() != nil:
		case errors.Is(err, sim.ErrNoAdapterSlot):
			s.writeError(w, newError(http.StatusBadRequest, "", fmt.Sprintf(
				"Cannot load LoRA adapter '%s': all %d LoRA slots (max_loras) are in use; unload an adapter first.",
				req.Name, s.eng.Config().MaxLoras)))
		default:
			e := fromError(err)
			if e.status == http.StatusBadRequest {
				e.typ = "InvalidUserInput"
			}
			s.writeError(w, e)
		}
		return
	}
	s.log.Info("loaded LoRA adapter", "name", req.Name, "path", req.Path)
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.Name))
}

// serveUnloadLoRA is POST /v1/unload_lora_adapter {lora_name}.
func (s *Server) serveUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
	}
	if !s.decodeBody(w, r, &req) {
		return
	}
	if req.Name == "" {
		s.writeError(w, newError(http.StatusBadRequest, "InvalidUserInput", "either 'lora_name' and 'lora_int_id' needs to be provided."))
		return
	}
	if err := s.eng.UnloadAdapter(r.Context(), req.Name); err != nil {
		e := fromError(err)
		if e.status == http.StatusNotFound {
			e.param = nil
		}
		s.writeError(w, e)
		return
	}
	s.log.Info("unloaded LoRA adapter", "name", req.Name)
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.Name))
}

// knownModel reports whether name is served: "" (the default), a base name
// or a loaded adapter; else it answers vLLM's 404.
func (s *Server) knownModel(w http.ResponseWriter, name string) bool {
	if name == "" || s.base[name] {
		return true
	}
	if _, ok := s.eng.Adapters()[name]; ok {
		return true
	}
	e := newError(http.StatusNotFound, "", fmt.Sprintf("The model `%s` does not exist.", name))
	param := "model"
	e.param = &param
	s.writeError(w, e)
	return false
}

// serveTokenize is POST /tokenize: {model, prompt} or {model, messages,
// add_generation_prompt}, with return_token_strs.
func (s *Server) serveTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model               string          `json:"model"`
		Prompt              *string         `json:"prompt"`
		Messages            json.RawMessage `json:"messages"`
		AddGenerationPrompt *bool           `json:"add_generation_prompt"`
		ReturnTokenStrs     bool            `json:"return_token_strs"`
	}
	if !s.decodeBody(w, r, &req) || !s.knownModel(w, req.Model) {
		return
	}
	var ids []uint32
	switch {
	case len(req.Messages) > 0 && string(req.Messages) != "null":
		msgs, err := schemas.ReadMessages(req.Messages)
		if err != nil {
			s.writeError(w, fromError(err))
			return
		}
		ids = s.eng.TokenizeChat(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
	case req.Prompt != nil:
		ids = s.eng.TokenizePrompt(*req.Prompt)
	default:
		s.writeError(w, newError(http.StatusBadRequest, "", "either 'prompt' or 'messages' must be provided"))
		return
	}
	resp := struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []uint32  `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}{Count: len(ids), MaxModelLen: s.maxLen, Tokens: ids}
	if resp.Tokens == nil {
		resp.Tokens = []uint32{}
	}
	if req.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i], _ = s.eng.Detokenize([]int64{int64(id)})
		}
		resp.TokenStrs = &strs
	}
	writeJSON(w, http.StatusOK, resp)
}

// serveDetokenize is POST /detokenize {model, tokens} → {prompt}.
func (s *Server) serveDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string  `json:"model"`
		Tokens []int64 `json:"tokens"`
	}
	if !s.decodeBody(w, r, &req) || !s.knownModel(w, req.Model) {
		return
	}
	text, err := s.eng.Detokenize(req.Tokens)
	if err != nil {
		s.writeError(w, fromError(err))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Prompt string `json:"prompt"`
	}{text})
}

// serveEmbeddings is POST /v1/embeddings: the sim's embeddings (sim.EmbedText),
// in OpenAI's shape with vLLM's id and created.
func (s *Server) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	if !s.jsonContent(w, r) {
		return
	}
	bp, ok := s.readBody(w, r)
	if !ok {
		return
	}
	defer s.putBody(bp)
	view, rerr := schemas.ReadRequest(schemas.KindEmbedding, *bp, s.model)
	if rerr != nil {
		s.writeError(w, fromError(rerr))
		return
	}
	if !s.knownModel(w, view.Model) {
		return
	}
	req := engine.Request{ID: r.Header.Get("X-Request-Id"), Kind: schemas.KindEmbedding, Model: view.Model, Body: *bp, View: view}
	res, err := s.eng.Generate(r.Context(), &req, noStream{})
	if err != nil {
		if r.Context().Err() == nil {
			s.writeError(w, fromError(err))
		}
		return
	}
	writeRaw(w, http.StatusOK, "application/json", res.Response)
}
