package simserver

import (
	"context"
	"net/http"
	"strconv"
)

// vLLM's sleep mode routes (vllm/entrypoints/serve/dev/sleep/api_router.py):
// served only with Config.DevMode (vLLM: VLLM_SERVER_DEV_MODE=1), and
// working only with Config.SleepMode (vLLM: --enable-sleep-mode; without it
// vLLM's engine asserts, a 500). Sleep and wake-up answer an empty 200 once
// done; the sim goes on with either when the client hangs up, as vLLM does.
// While asleep /health is 200, /v1/models and /tokenize answer, and the
// generation and embeddings routes get the sim's 503 (ErrEngineAsleep).

// serveSleep is POST /sleep?level=N (N 0, 1 or 2; default 1: the sim
// sleeps alike at every level).
func (s *Server) serveSleep(w http.ResponseWriter, r *http.Request) {
	if !s.sleepMode(w) {
		return
	}
	if v := r.URL.Query().Get("level"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 2 {
			s.writeError(w, newError(http.StatusBadRequest, "", "level must be 0, 1 or 2, not "+strconv.Quote(v)))
			return
		}
	}
	if err := s.eng.Sleep(context.WithoutCancel(r.Context())); err != nil {
		s.writeError(w, fromError(err))
		return
	}
	s.log.Info("asleep")
	writeRaw(w, http.StatusOK, "application/json", nil)
}

// serveWakeUp is POST /wake_up (tags are accepted and ignored: the sim
// wakes whole).
func (s *Server) serveWakeUp(w http.ResponseWriter, r *http.Request) {
	if !s.sleepMode(w) {
		return
	}
	if err := s.eng.WakeUp(context.WithoutCancel(r.Context())); err != nil {
		s.writeError(w, fromError(err))
		return
	}
	s.log.Info("awake")
	writeRaw(w, http.StatusOK, "application/json", nil)
}

// serveIsSleeping is GET /is_sleeping: {"is_sleeping": bool}.
func (s *Server) serveIsSleeping(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, struct {
		IsSleeping bool `json:"is_sleeping"`
	}{s.eng.Sleeping()})
}

// sleepMode answers vLLM's 500 unless the server runs with sleep mode.
func (s *Server) sleepMode(w http.ResponseWriter) bool {
	if s.cfg.SleepMode {
		return true
	}
	s.writeError(w, newError(http.StatusInternalServerError, "", "Sleep mode is not enabled in the model config (start with --enable-sleep-mode)"))
	return false
}
