package simserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// DefaultVersion is what GET /version answers: a vLLM version with a local
// label (PEP 440), so clients that parse it get a vLLM they know.
const DefaultVersion = "0.11.0+tokenbus.sim"

// Config sets up a Server. The zero value works.
type Config struct {
	// Root is the base model's "root" in /v1/models (vLLM: the --model
	// path). Default: the sim's model name.
	Root string
	// APIKeys, if any, are required as "Authorization: Bearer" on /v1 paths.
	APIKeys []string
	// LegacyErrors answers errors in vLLM's flat pre-0.10.1 shape.
	LegacyErrors bool
	// AllowRuntimeLoRA offers /v1/load_lora_adapter and
	// /v1/unload_lora_adapter (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
	AllowRuntimeLoRA bool
	// DevMode serves vLLM's development routes that the sim has: /sleep,
	// /wake_up and /is_sleeping (vLLM: VLLM_SERVER_DEV_MODE=1).
	DevMode bool
	// SleepMode lets the engine sleep (vLLM: --enable-sleep-mode); without
	// it /sleep and /wake_up answer 500, as vLLM's.
	SleepMode bool
	// GPUCacheMetric also exports vllm:gpu_cache_usage_perc, the name of
	// vllm:kv_cache_usage_perc before vLLM 0.10.
	GPUCacheMetric bool
	// Version is GET /version's answer; default DefaultVersion.
	Version string
	// MaxBodyBytes caps a request body (413 past it); default 64 MiB.
	MaxBodyBytes int64
	// MaxPendingBytes caps the SSE output waiting for a slow client; past
	// it the request is aborted. Default 16 MiB.
	MaxPendingBytes int
	// ShutdownTimeout is how long Serve lets open requests finish once its
	// context ends, before it closes their connections. Default 5s.
	ShutdownTimeout time.Duration
}

// Server is the HTTP front end of one sim engine. It implements
// http.Handler; Serve runs it on a listener.
type Server struct {
	cfg     Config
	eng     *sim.Engine
	log     *slog.Logger
	model   string          // the first base name: metrics' model_name
	base    map[string]bool // base model names
	names   []string        // base model names, in order
	maxLen  int
	keys    [][32]byte // sha256 of the API keys
	closed  atomic.Bool
	flushes atomic.Int64 // SSE writes, for the benchmarks

	reg     *prometheus.Registry
	metrics http.Handler
	ttft    prometheus.Observer
	itl     prometheus.Observer
	e2e     prometheus.Observer

	loraMu     sync.Mutex
	loraLoad   map[string]*loraCount // adapter → requests in flight on it
	loraSeries map[loraLabels]float64
	loraOrder  []loraLabels // oldest first, to bound loraSeries

	sinks  sync.Pool // *streamSink
	bodies sync.Pool // *[]byte
}

// New makes a server for eng, which the caller closes after the server. log
// nil discards.
func New(cfg Config, eng *sim.Engine, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.MaxPendingBytes <= 0 {
		cfg.MaxPendingBytes = 16 << 20
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	ec := eng.Config()
	if cfg.Root == "" {
		cfg.Root = ec.Model
	}
	s := &Server{
		cfg:        cfg,
		eng:        eng,
		log:        log,
		model:      ec.Model,
		base:       map[string]bool{ec.Model: true},
		names:      []string{ec.Model},
		maxLen:     ec.MaxModelLen,
		loraLoad:   map[string]*loraCount{},
		loraSeries: map[loraLabels]float64{},
	}
	for _, n := range ec.ServedNames {
		if n != "" && !s.base[n] {
			s.base[n] = true
			s.names = append(s.names, n)
		}
	}
	for _, k := range cfg.APIKeys {
		if k != "" {
			s.keys = append(s.keys, sha256.Sum256([]byte(k)))
		}
	}
	s.initMetrics()
	return s
}

// Close makes /health answer 503; requests keep being served (Serve's
// shutdown ends them).
func (s *Server) Close() { s.closed.Store(true) }

// Serve serves on ln until ctx ends, then shuts down: /health turns 503, the
// listener closes, open requests get Config.ShutdownTimeout to finish and are
// then cut (which aborts them in the sim). It returns nil after a shutdown
// caused by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.Close()
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		s.log.Warn("requests still open at shutdown: closing their connections", "err", err)
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if len(s.keys) > 0 && strings.HasPrefix(path, "/v1") && r.Method != http.MethodOptions && !s.authorized(r) {
		writeRaw(w, http.StatusUnauthorized, "application/json", []byte(`{"error":"Unauthorized"}`))
		return
	}
	switch path {
	case "/v1/chat/completions":
		if s.method(w, r, http.MethodPost) {
			s.serveGenerate(w, r, true)
		}
	case "/v1/completions":
		if s.method(w, r, http.MethodPost) {
			s.serveGenerate(w, r, false)
		}
	case "/v1/embeddings":
		if s.method(w, r, http.MethodPost) {
			s.serveEmbeddings(w, r)
		}
	case "/v1/models":
		if s.method(w, r, http.MethodGet) {
			s.serveModels(w)
		}
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		if !s.cfg.AllowRuntimeLoRA {
			notFound(w)
		} else if s.method(w, r, http.MethodPost) {
			if path == "/v1/load_lora_adapter" {
				s.serveLoadLoRA(w, r)
			} else {
				s.serveUnloadLoRA(w, r)
			}
		}
	case "/sleep", "/wake_up", "/is_sleeping":
		switch {
		case !s.cfg.DevMode:
			notFound(w)
		case path == "/is_sleeping":
			if s.method(w, r, http.MethodGet) {
				s.serveIsSleeping(w)
			}
		case s.method(w, r, http.MethodPost):
			if path == "/sleep" {
				s.serveSleep(w, r)
			} else {
				s.serveWakeUp(w, r)
			}
		}
	case "/metrics":
		if s.method(w, r, http.MethodGet) {
			s.metrics.ServeHTTP(w, r)
		}
	case "/health":
		if s.method(w, r, http.MethodGet) {
			status := http.StatusOK
			if s.closed.Load() || s.eng.Health(r.Context()) != nil {
				status = http.StatusServiceUnavailable
			}
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(status)
		}
	case "/version":
		if s.method(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, struct {
				Version string `json:"version"`
			}{s.cfg.Version})
		}
	case "/tokenize":
		if s.method(w, r, http.MethodPost) {
			s.serveTokenize(w, r)
		}
	case "/detokenize":
		if s.method(w, r, http.MethodPost) {
			s.serveDetokenize(w, r)
		}
	default:
		notFound(w)
	}
}

// authorized checks the bearer token against the keys in constant time.
func (s *Server) authorized(r *http.Request) bool {
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "bearer") {
		return false
	}
	h := sha256.Sum256([]byte(tok))
	good := 0
	for _, k := range s.keys {
		good |= subtle.ConstantTimeCompare(h[:], k[:])
	}
	return good == 1
}

// method answers FastAPI's 405 unless r uses m.
func (s *Server) method(w http.ResponseWriter, r *http.Request, m string) bool {
	if r.Method == m {
		return true
	}
	w.Header().Set("Allow", m)
	writeRaw(w, http.StatusMethodNotAllowed, "application/json", []byte(`{"detail":"Method Not Allowed"}`))
	return false
}

// notFound is FastAPI's answer for a route that does not exist.
func notFound(w http.ResponseWriter) {
	writeRaw(w, http.StatusNotFound, "application/json", []byte(`{"detail":"Not Found"}`))
}
