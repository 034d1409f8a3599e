package httpengine

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// An engine (or a proxy before it) that quotes the Authorization header it
// got: the engine's API key never reaches an error message.
func TestUpstreamErrorsHideTheEngineKey(t *testing.T) {
	const key = "sk-ENGINEMARKER0123456789abcdef"
	var failModels atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		echo := fmt.Sprintf(`{"error":{"message":"upstream saw Authorization: %s","type":"invalid_request_error","param":%q,"code":"bad"}}`,
			r.Header.Get("Authorization"), r.Header.Get("Authorization"))
		switch {
		case r.URL.Path == "/health":
		case r.URL.Path == "/v1/models" && !failModels.Load():
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case r.URL.Path == "/v1/chat/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\n\n", echo)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, echo)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := fastConfig(srv.URL)
	cfg.APIKey = key
	e := newEngine(t, cfg)
	healthy(t, e)

	var errs []error
	_, err := e.Generate(t.Context(), completion(`{"model":"base","prompt":"hi"}`), &recSink{})
	errs = append(errs, err)
	_, err = e.Generate(t.Context(), chat(`{"model":"base","stream":true,"messages":[{"role":"user","content":"hi"}]}`), &recSink{})
	errs = append(errs, err)
	failModels.Store(true)
	_, err = e.FetchModels(t.Context())
	errs = append(errs, err)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "upstream saw Authorization") {
			t.Fatalf("error %d is not the upstream's: %v", i, err)
		}
		var se *schemas.Error
		if !errors.As(err, &se) {
			t.Fatalf("error %d: %T", i, err)
		}
		if strings.Contains(string(se.JSON()), "ENGINEMARKER") {
			t.Errorf("error %d quotes the engine key: %v", i, err)
		}
	}
}
