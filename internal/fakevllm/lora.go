package fakevllm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Loaded lists the adapters loaded, sorted.
func (s *Server) Loaded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sortedKeys(s.loaded)
}

// AddAdapter loads an adapter as --lora-modules would.
func (s *Server) AddAdapter(name, path string) {
	s.mu.Lock()
	s.loaded[name] = path
	s.mu.Unlock()
}

// Log is the LoRA operations so far, in order ("load a", "unload b").
func (s *Server) Log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

func (s *Server) isLoaded(model string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.loaded[model]
	return ok
}

// lora is /v1/load_lora_adapter and /v1/unload_lora_adapter, with vLLM's
// answers (as of vLLM 0.33.0). A load takes LoadDelay (less if the client
// goes away); a path containing "missing" is not found (404), one containing
// "bad" is refused (rank too large: vLLM's engine core raises, and the API
// server answers 500 InternalServerError), one containing "dead" fails as on
// a dead engine core (also a 500). A name that is a base model's is a 400.
func (s *Server) lora(w http.ResponseWriter, r *http.Request, load bool) {
	if s.NoLoRAAPI {
		writeJSON(w, 404, `{"detail":"Not Found"}`)
		return
	}
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if !load {
		s.Unloads.Add(1)
		s.mu.Lock()
		_, ok := s.loaded[req.Name]
		delete(s.loaded, req.Name)
		s.log = append(s.log, "unload "+req.Name)
		s.mu.Unlock()
		if !ok {
			writeJSON(w, 404, fmt.Sprintf(`{"error":{"message":"The lora adapter '%s' cannot be found.","type":"NotFoundError","param":null,"code":404}}`, req.Name))
			return
		}
		fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
		return
	}
	s.Loads.Add(1)
	if !pause(r, s.LoadDelay) {
		return // the client is gone: the fake skips the load
	}
	if s.IsBase(req.Name) {
		writeJSON(w, 400, fmt.Sprintf(`{"error":{"message":"The lora adapter '%s' conflicts with a served base model.","type":"InvalidUserInput","param":null,"code":400}}`, req.Name))
		return
	}
	s.mu.Lock()
	_, already := s.loaded[req.Name]
	ok := !already && !strings.Contains(req.Path, "missing") && !strings.Contains(req.Path, "bad") && !strings.Contains(req.Path, "dead")
	if ok {
		s.loaded[req.Name] = req.Path
	}
	s.log = append(s.log, "load "+req.Name)
	s.mu.Unlock()
	switch {
	case already:
		writeJSON(w, 400, fmt.Sprintf(`{"object":"error","message":"The lora adapter '%s' has already been loaded.","type":"BadRequestError","param":null,"code":400}`, req.Name))
	case strings.Contains(req.Path, "missing"):
		writeJSON(w, 404, fmt.Sprintf(`{"error":{"message":"Loading lora %s failed: No adapter found for %s","type":"NotFoundError","param":null,"code":404}}`, req.Name, req.Path))
	case strings.Contains(req.Path, "dead"):
		writeJSON(w, 500, `{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}`)
	case !ok:
		writeJSON(w, 500, `{"error":{"message":"LoRA rank 512 is greater than max_lora_rank 64.","type":"InternalServerError","param":null,"code":500}}`)
	default:
		fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
	}
}
