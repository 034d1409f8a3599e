package httpengine

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// Error answers of real servers over HTTP: FastAPI's 422 list is a 400
// naming the field, a plain-text 500 a 502 with the text (the key
// redacted), an empty 4xx or 5xx an error naming the status and the
// endpoint, logged in one line with the URL and without the key.
func TestErrorAnswers(t *testing.T) {
	const key = "sk-secret-123"
	var answer struct {
		sync.Mutex
		status int
		ctype  string
		body   string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodGet {
			io.WriteString(w, `{"data":[{"id":"base"}]}`)
			return
		}
		answer.Lock()
		defer answer.Unlock()
		if answer.ctype != "" {
			w.Header().Set("Content-Type", answer.ctype)
		}
		w.WriteHeader(answer.status)
		io.WriteString(w, answer.body)
	}))
	t.Cleanup(srv.Close)
	var logs testenv.Buffer
	cfg := fastConfig(srv.URL)
	cfg.APIKey = key
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e := newEngine(t, cfg)
	healthy(t, e)

	for _, tc := range []struct {
		name, ctype, body string
		status            int
		wantStatus        int
		code, param, msg  string
		logged            bool
	}{
		{"FastAPI 422", "application/json", `{"detail":[{"type":"extra_forbidden","loc":["body","ignore_eos"],"msg":"Extra inputs are not permitted","input":true}]}`,
			422, 400, "", "ignore_eos", "ignore_eos: Extra inputs are not permitted", false},
		{"plain-text 500", "text/plain", "Internal error: bad token sk-secret-123 in header\n",
			500, 502, "engine_error", "", "the engine answered 500 Internal Server Error: Internal error: bad token *** in header", false},
		{"empty 400", "", "", 400, 400, "", "",
			"the engine answered 400 Bad Request with an empty body to POST /v1/chat/completions", true},
		{"empty 500", "", "", 500, 502, "engine_error", "",
			"the engine answered 500 Internal Server Error with an empty body to POST /v1/chat/completions", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer.Lock()
			answer.status, answer.ctype, answer.body = tc.status, tc.ctype, tc.body
			answer.Unlock()
			before := strings.Count(logs.String(), "\n")
			req := chat(`{"model":"base","stream":true}`)
			_, err := e.Generate(t.Context(), req, &recSink{})
			se := asError(t, err, tc.wantStatus, tc.code)
			if se.Body.Message != tc.msg || param(se) != tc.param {
				t.Errorf("message %q param %q, want %q and %q", se.Body.Message, param(se), tc.msg, tc.param)
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")[before:]
			var hits []string
			for _, l := range lines {
				if strings.Contains(l, "empty body") {
					hits = append(hits, l)
				}
			}
			switch {
			case !tc.logged && len(hits) > 0:
				t.Errorf("logged %q", hits)
			case tc.logged && (len(hits) != 1 || !strings.Contains(hits[0], "url="+srv.URL+"/v1/chat/completions") ||
				!strings.Contains(hits[0], "request_id="+req.ID) || strings.Contains(hits[0], key)):
				t.Errorf("log lines %q: want one with the URL and the request id, not the key", hits)
			}
			if strings.Contains(logs.String(), key) {
				t.Errorf("the key is in the log")
			}
		})
	}
}

func param(se *schemas.Error) string {
	if se.Body.Param == nil {
		return ""
	}
	return *se.Body.Param
}
