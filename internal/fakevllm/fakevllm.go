package fakevllm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is the fake. Set its fields before serving; the rest goes through
// methods, safe for concurrent use.
type Server struct {
	Base       []string      // base model names; default ["base"]
	APIKey     string        // if set, required as a Bearer token on /v1
	LoadDelay  time.Duration // how long a LoRA load takes
	NoLoRAAPI  bool          // as without VLLM_ALLOW_RUNTIME_LORA_UPDATING: 404 {"detail":"Not Found"}
	AnyModel   bool          // serve whatever model a request names, as llama.cpp's server does
	Pooling    bool          // an embedding model: /v1/embeddings answers (else vLLM's 400 for a generative model)
	NoTokenize bool          // no /tokenize and /detokenize: 404 {"detail":"Not Found"}, as OpenAI-compatible servers without them
	// MaxModelLen is the max_model_len /v1/models gives the base models
	// (adapters get null, as from vLLM); 0 sends null for them too, as a
	// server that does not know it. New sets 8192.
	MaxModelLen int
	// Default scripts the requests whose body has no x_fake.
	Default Script
	// EngineID is the remote_engine_id of its prefills' answers (vLLM's
	// KV-transfer handshake, disagg.go); New makes one per server.
	EngineID string

	healthy   atomic.Bool
	metrics   atomic.Value // string
	Loads     atomic.Int64 // load_lora_adapter calls
	Unloads   atomic.Int64
	Cancelled chan string // ids of requests whose client went away while "slow" (dropped when full)

	mu       sync.Mutex
	loaded   map[string]string   // adapter → path
	log      []string            // "load a", "unload b", in order
	received []Request           // completion, embeddings, tokenize and detokenize requests, in arrival order
	byID     map[string]int      // request id → its last index in received
	sent     map[string][]string // request id → chunk JSON sent
	models   int                 // GET /v1/models answered
	cut      map[string]bool     // request ids whose stream was cut (Script.CutAfter)

	// The KV-transfer handshake (disagg.go).
	refuseKV  atomic.Bool
	prefills  int      // answered with kv_transfer_params
	nextBlock int      // the next block id a prefill names
	transfers [][]byte // the params of the decodes received
}

// Request is one completion request as the fake received it.
type Request struct {
	ID     string // X-Request-Id, else "fake-<n>" (n counts from 1)
	Path   string
	Header http.Header
	Body   []byte
}

var engines atomic.Int64 // fakes made: their engine ids

// New makes a healthy fake with no adapters.
func New() *Server {
	s := &Server{Base: []string{"base"}, MaxModelLen: 8192, Cancelled: make(chan string, 100), loaded: map[string]string{},
		byID: map[string]int{}, sent: map[string][]string{}, EngineID: fmt.Sprintf("fakevllm-%d", engines.Add(1))}
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

// Received is every completion request so far, in arrival order.
func (s *Server) Received() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.received)
}

// Body is the body received for request id (nil: none came).
func (s *Server) Body(id string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.byID[id]; ok {
		return s.received[i].Body
	}
	return nil
}

// Header is the headers received for request id.
func (s *Server) Header(id string) http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.byID[id]; ok {
		return s.received[i].Header
	}
	return nil
}

// Sent is the chunk JSON sent for request id, in order ([DONE] and error
// objects left out).
func (s *Server) Sent(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent[id])
}

// Requests counts the completion requests received.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.received)
}

// ModelsRequests counts the GET /v1/models answered.
func (s *Server) ModelsRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.models
}

// IsBase reports whether model is a base model.
func (s *Server) IsBase(model string) bool { return slices.Contains(s.Base, model) }

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
		s.serveModels(w)
	case "/v1/chat/completions", "/v1/completions":
		s.complete(w, r)
	case "/v1/embeddings":
		s.embeddings(w, r)
	case "/tokenize", "/detokenize":
		if s.NoTokenize {
			writeJSON(w, 404, `{"detail":"Not Found"}`)
		} else if r.URL.Path == "/tokenize" {
			s.tokenize(w, r)
		} else {
			s.detokenize(w, r)
		}
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

func (s *Server) serveModels(w http.ResponseWriter) {
	type entry struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
	}
	var data []entry
	var maxLen *int
	if s.MaxModelLen > 0 {
		maxLen = &s.MaxModelLen
	}
	for _, b := range s.Base {
		data = append(data, entry{ID: b, Object: "model", Root: "/models/" + b, MaxModelLen: maxLen})
	}
	parent := s.Base[0]
	s.mu.Lock()
	s.models++
	for _, name := range sortedKeys(s.loaded) {
		data = append(data, entry{ID: name, Object: "model", Root: s.loaded[name], Parent: &parent})
	}
	s.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"object": "list", "data": data})
	writeJSON(w, 200, string(b))
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
