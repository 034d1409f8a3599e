package fakevllm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is the fake. Set fields before serving; the rest through methods.
type Server struct {
	Base      []string      // base model names; default ["base"]
	APIKey    string        // if set, required as a Bearer token on /v1
	LoadDelay time.Duration // how long a LoRA load takes
	NoLoRAAPI bool          // as without VLLM_ALLOW_RUNTIME_LORA_UPDATING: 404 {"detail":"Not Found"}

	healthy   atomic.Bool
	metrics   atomic.Value // string
	Loads     atomic.Int64 // load_lora_adapter calls
	Unloads   atomic.Int64
	Cancelled chan string // ids of requests whose client went away while "slow"

	mu       sync.Mutex
	loaded   map[string]string   // adapter → path
	log      []string            // "load a", "unload b", in order
	sent     map[string][]string // request id → chunk JSON sent
	bodies   map[string][]byte   // request id → body received
	headers  map[string]http.Header
	requests int
}

// New makes a healthy fake with no adapters.
func New() *Server {
	s := &Server{Base: []string{"base"}, Cancelled: make(chan string, 100), loaded: map[string]string{},
		sent: map[string][]string{}, bodies: map[string][]byte{}, headers: map[string]http.Header{}}
	s.healthy.Store(true)
	s.metrics.Store(DefaultMetrics)
	return s
}

// DefaultMetrics is /metrics text as vLLM 0.10 writes it (shortened).
const DefaultMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.25
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="base"} 1234.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="base"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="base"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="base"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="base"} 0.5
`

// SetHealthy makes /health answer 200 or 503.
func (s *Server) SetHealthy(ok bool) { s.healthy.Store(ok) }

// SetMetrics replaces the /metrics text.
func (s *Server) SetMetrics(text string) { s.metrics.Store(text) }

// Loaded lists the adapters loaded, sorted.
func (s *Server) Loaded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.loaded {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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

// Sent is the chunk JSON sent for request id, in order.
func (s *Server) Sent(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sent[id]...)
}

// Body is the body received for request id.
func (s *Server) Body(id string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodies[id]
}

// Header is the headers received for request id.
func (s *Server) Header(id string) http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.headers[id]
}

// Requests counts the completion requests received.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// ServeHTTP routes like vLLM's server.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.APIKey != "" && strings.HasPrefix(r.URL.Path, "/v1") && r.Header.Get("Authorization") != "Bearer "+s.APIKey {
		writeJSON(w, 401, `{"error":{"message":"Unauthorized","type":"authentication_error","param":null,"code":401}}`)
		return
	}
	switch r.URL.Path {
	case "/health":
		if s.healthy.Load() {
			w.WriteHeader(200)
		} else {
			w.WriteHeader(503)
		}
	case "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		io.WriteString(w, s.metrics.Load().(string))
	case "/v1/models":
		s.models(w)
	case "/v1/chat/completions", "/v1/completions":
		s.complete(w, r, r.URL.Path == "/v1/chat/completions")
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		s.lora(w, r, r.URL.Path == "/v1/load_lora_adapter")
	case "/pid":
		fmt.Fprint(w, os.Getpid())
	case "/env":
		fmt.Fprint(w, os.Getenv(r.URL.Query().Get("name")))
	default:
		writeJSON(w, 404, `{"detail":"Not Found"}`)
	}
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func (s *Server) models(w http.ResponseWriter) {
	type entry struct {
		ID     string  `json:"id"`
		Object string  `json:"object"`
		Root   string  `json:"root"`
		Parent *string `json:"parent"`
	}
	var data []entry
	for _, b := range s.Base {
		data = append(data, entry{ID: b, Object: "model", Root: "/models/" + b})
	}
	parent := s.Base[0]
	for _, name := range s.Loaded() {
		s.mu.Lock()
		p := s.loaded[name]
		s.mu.Unlock()
		data = append(data, entry{ID: name, Object: "model", Root: p, Parent: &parent})
	}
	b, _ := json.Marshal(map[string]any{"object": "list", "data": data})
	writeJSON(w, 200, string(b))
}

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
	time.Sleep(s.LoadDelay)
	s.mu.Lock()
	_, already := s.loaded[req.Name]
	ok := !already && !strings.Contains(req.Path, "missing") && !strings.Contains(req.Path, "bad")
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
	case !ok:
		writeJSON(w, 400, `{"error":{"message":"Invalid LoRA adapter: rank 512 is greater than max_lora_rank 64","type":"BadRequestError","param":null,"code":400}}`)
	default:
		fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
	}
}

// Script is the x_fake object.
type Script struct {
	Mode    string `json:"mode"`
	Chunks  int    `json:"chunks"`
	Status  int    `json:"status"`
	DelayMS int    `json:"delay_ms"`
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("X-Request-Id")
	s.mu.Lock()
	s.requests++
	s.bodies[id] = body
	s.headers[id] = r.Header.Clone()
	s.mu.Unlock()

	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage *bool `json:"include_usage"`
		} `json:"stream_options"`
		Fake Script `json:"x_fake"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, 400, fmt.Sprintf(`{"object":"error","message":"malformed JSON: %v","type":"BadRequestError","param":null,"code":400}`, strings.ReplaceAll(err.Error(), `"`, `'`)))
		return
	}
	f := req.Fake
	if f.Chunks == 0 {
		f.Chunks = 3
	}
	if f.Status == 0 {
		f.Status = 400
	}
	switch f.Mode {
	case "error_flat":
		writeJSON(w, f.Status, fmt.Sprintf(`{"object":"error","message":"flat %d","type":"BadRequestError","param":null,"code":%d}`, f.Status, f.Status))
		return
	case "error_nested":
		writeJSON(w, f.Status, fmt.Sprintf(`{"error":{"message":"nested %d","type":"BadRequestError","param":"temperature","code":%d}}`, f.Status, f.Status))
		return
	}
	if !s.IsBase(req.Model) && !s.isLoaded(req.Model) {
		writeJSON(w, 404, fmt.Sprintf(`{"error":{"message":"The model `+"`%s`"+` does not exist.","type":"NotFoundError","param":"model","code":404}}`, req.Model))
		return
	}
	chunk := func(i int) string {
		if chat {
			return fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{"content":"tok%d"},"logprobs":null,"finish_reason":null}]}`, id, req.Model, i)
		}
		return fmt.Sprintf(`{"id":"cmpl-%s","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"tok%d","logprobs":null,"finish_reason":null}]}`, id, req.Model, i)
	}
	if !req.Stream {
		if f.Mode == "slow" {
			<-r.Context().Done()
			s.Cancelled <- id
			return
		}
		obj, field := "text_completion", `"text":"done"`
		if chat {
			obj, field = "chat.completion", `"message":{"role":"assistant","content":"done"}`
		}
		writeJSON(w, 200, fmt.Sprintf(`{"id":"x-%s","object":%q,"created":1,"model":%q,"choices":[{"index":0,%s,"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d},"x_extra":{"kept":true}}`,
			id, obj, req.Model, field, f.Chunks, 5+f.Chunks))
		return
	}

	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	var pending strings.Builder
	send := func(data string, record bool) {
		if record {
			s.mu.Lock()
			s.sent[id] = append(s.sent[id], data)
			s.mu.Unlock()
		}
		pending.WriteString("data: " + data + "\n\n")
		if f.Mode != "burst" {
			io.WriteString(w, pending.String())
			pending.Reset()
			fl.Flush()
			if f.DelayMS > 0 {
				time.Sleep(time.Duration(f.DelayMS) * time.Millisecond)
			}
		}
	}
	n := f.Chunks
	if f.Mode == "slow" {
		n = 1
	}
	for i := range n {
		send(chunk(i), true)
	}
	switch f.Mode {
	case "slow":
		<-r.Context().Done()
		s.Cancelled <- id
		return
	case "midstream_error":
		send(`{"error": {"object": "error", "message": "engine exploded", "type": "InternalServerError", "param": null, "code": 500}}`, false)
		send("[DONE]", false)
		return
	case "break":
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err == nil {
			buf.Flush()
			conn.Close()
		}
		return
	case "nodone":
		return
	}
	if req.StreamOptions != nil && (req.StreamOptions.IncludeUsage == nil || *req.StreamOptions.IncludeUsage) {
		send(fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1,"model":%q,"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":2}}}`, id, req.Model, n, 7+n), true)
	}
	send("[DONE]", false)
	if f.Mode == "burst" {
		io.WriteString(w, pending.String())
		fl.Flush()
	}
}

// IsBase reports whether model is a base model.
func (s *Server) IsBase(model string) bool {
	for _, b := range s.Base {
		if b == model {
			return true
		}
	}
	return false
}

func (s *Server) isLoaded(model string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.loaded[model]
	return ok
}
