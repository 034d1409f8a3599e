package integration

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/schemas"
)

// Every process reads a request body with the one reader
// (schemas.ReadRequest), so a body means the same to the gateway that
// routes, limits and accounts it and to the engine that runs it: a key in
// another case is not the field, a repeated field is refused. These are the
// bodies issue 11 found walking around the gateway.
func TestOneReadingOfARequest(t *testing.T) {
	t.Parallel()
	d := startDev(t, func(c *program.DevConfig) {
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = time.Millisecond, time.Millisecond
	})
	msgs := `"messages":[{"role":"user","content":"Tell me a long story"}]`

	// "Stream" is not "stream": a stream:false request gets a whole
	// chat.completion, not a body that holds only usage.
	s := post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","stream":false,"Stream":true,`+msgs+`}`)
	var whole struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if s.Status != 200 || json.Unmarshal([]byte(s.Body), &whole) != nil || whole.Object != "chat.completion" ||
		len(whole.Choices) != 1 || whole.Choices[0].Message.Content == "" {
		t.Fatalf("stream:false with a Stream key: %d %s", s.Status, s.Body)
	}

	// "Max_Tokens" is not "max_tokens": 5 tokens are admitted, generated
	// and accounted, not 300.
	s = post(t, d.URL, "/v1/chat/completions", `{"model":"llama-8b","max_tokens":5,"Max_Tokens":300,"ignore_eos":true,`+msgs+`}`)
	if s.Status != 200 || json.Unmarshal([]byte(s.Body), &whole) != nil || whole.Usage.CompletionTokens != 5 {
		t.Fatalf("max_tokens 5 with a Max_Tokens key: %d %s", s.Status, s.Body)
	}

	// A repeated field is a 400 naming it, at the gateway.
	for _, body := range []string{
		`{"model":"llama-8b","max_tokens":5,"max_tokens":300,` + msgs + `}`,
		`{"model":"llama-8b","stream":false,"stream":true,` + msgs + `}`,
	} {
		s = post(t, d.URL, "/v1/chat/completions", body)
		if e := errorBody(t, s.Body); s.Status != 400 || e.Param == nil {
			t.Fatalf("%s: %d %s", body, s.Status, s.Body)
		}
	}

	// A NATS-native client's request is read by the dispatcher with the same
	// reader: the same body gets the same 400, without reaching a worker.
	nc := connectNATS(t, d.NATSURL)
	m := nats.NewMsg(schemas.ReqSubject("llama-8b"))
	m.Header.Set(schemas.HdrRequestID, "native-dup")
	m.Header.Set(schemas.HdrKind, "chat")
	m.Data = []byte(`{"model":"llama-8b","max_tokens":5,"max_tokens":300,` + msgs + `}`)
	reply, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f, err := schemas.ParseFrame(reply.Data)
	if err != nil || f.Type != schemas.FrameError {
		t.Fatalf("NATS-native repeated max_tokens: %q", reply.Data)
	}
	if e := schemas.ParseErrorPayload(f.Payload); e.Status != 400 || e.Body.Param == nil || *e.Body.Param != "max_tokens" {
		t.Fatalf("NATS-native repeated max_tokens: %s", f.Payload)
	}
}
