package vllm

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// What reaches vLLM: return_token_ids added first to a stream whose
// requester strips ids (Request.TokenIDs) and whose body does not name it,
// max_tokens to a continuation from token ids without one (vLLM's 16 would
// end it early: the context left instead), and otherwise the body byte for
// byte.
func TestRequestToVLLM(t *testing.T) {
	f, srv := startFake(t)
	e := newEngine(t, fastConfig(srv.URL))
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := e.MaxModelLens()["base"]; n != 8192 {
			return fmt.Errorf("max_model_len %d", n)
		}
		return nil
	})
	const chat = `{"model":"base","stream":%s,"messages":[{"role":"user","content":"hi"}]%s}`
	for i, tc := range []struct {
		kind     schemas.Kind
		body     string
		tokenIDs bool
		resume   int
		want     string
	}{
		{schemas.KindChat, fmt.Sprintf(chat, "true", ""), true, 0, `{"return_token_ids":true,` + fmt.Sprintf(chat, "true", "")[1:]},
		{schemas.KindChat, fmt.Sprintf(chat, "true", ""), false, 0, fmt.Sprintf(chat, "true", "")},
		{schemas.KindChat, fmt.Sprintf(chat, "false", ""), true, 0, fmt.Sprintf(chat, "false", "")},
		{schemas.KindChat, fmt.Sprintf(chat, "true", `,"return_token_ids":false`), true, 0, fmt.Sprintf(chat, "true", `,"return_token_ids":false`)},
		{schemas.KindCompletion, `{"model":"base","stream":true,"prompt":[101,102,1000],"return_token_ids":true}`, true, 1,
			`{"max_tokens":8189,"model":"base","stream":true,"prompt":[101,102,1000],"return_token_ids":true}`},
		{schemas.KindCompletion, `{"model":"base","stream":true,"prompt":[101,102,1000],"max_tokens":4}`, true, 1,
			`{"return_token_ids":true,"model":"base","stream":true,"prompt":[101,102,1000],"max_tokens":4}`},
		{schemas.KindCompletion, `{"model":"base","stream":true,"prompt":"once"}`, false, 2, `{"model":"base","stream":true,"prompt":"once"}`},
	} {
		req := &engine.Request{ID: fmt.Sprintf("q%d", i), Kind: tc.kind, Model: "base", Body: []byte(tc.body), TokenIDs: tc.tokenIDs, Resume: tc.resume}
		if _, err := e.Generate(t.Context(), req, &recSink{}); err != nil {
			t.Fatal(err)
		}
		if got := string(f.Body(req.ID)); got != tc.want {
			t.Errorf("%d: vLLM got %s\nwant %s", i, got, tc.want)
		}
		if string(req.Body) != tc.body {
			t.Errorf("%d: the request's body changed: %s", i, req.Body)
		}
	}
}

// With PriorityBands (vLLM's --scheduling-policy priority), a request's band
// becomes its vLLM priority, the client's own added within ±999: in place of
// the client's "priority", or last.
func TestBandToVLLMPriority(t *testing.T) {
	f, srv := startFake(t)
	cfg := fastConfig(srv.URL)
	cfg.PriorityBands = true
	e := newEngine(t, cfg)
	for i, tc := range []struct {
		band schemas.Band
		body string
		want string
	}{
		{schemas.BandBatch, `{"model":"base","prompt":"x"}`, `{"model":"base","prompt":"x","priority":1000}`},
		{schemas.BandCritical, `{"model":"base","priority": 5 ,"prompt":"x"} `, `{"model":"base","priority": -995 ,"prompt":"x"} `},
		{schemas.BandInteractive, `{"model":"base","prompt":"x","priority":-5000}`, `{"model":"base","prompt":"x","priority":-999}`},
		{schemas.BandBatch, `{"model":"base","prompt":"say \"priority\": 3","user":"u"}`, `{"model":"base","prompt":"say \"priority\": 3","user":"u","priority":1000}`},
		{0, `{"model":"base","prompt":"x"}`, `{"model":"base","prompt":"x"}`}, // no band said: untouched
	} {
		req := &engine.Request{ID: fmt.Sprintf("p%d", i), Kind: schemas.KindCompletion, Model: "base", Body: []byte(tc.body), Band: tc.band}
		if _, err := e.Generate(t.Context(), req, &recSink{}); err != nil {
			t.Fatal(err)
		}
		if got := string(f.Body(req.ID)); got != tc.want {
			t.Errorf("%d: vLLM got %s\nwant %s", i, got, tc.want)
		}
	}
}
