package vllm

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

func TestKVEventsConfig(t *testing.T) {
	for _, tc := range []struct {
		name, kv, cmd, topic string
		want                 string // endpoint; "port" any local port
		wantTopic            string
		err                  bool
	}{
		{"off", "", "vllm serve m", "", "", "", false},
		{"an endpoint", "tcp://10.0.0.1:5557", "", "kv", "tcp://10.0.0.1:5557", "kv", false},
		{"auto without a command", KVEventsAuto, "", "", "", "", true},
		{"auto: the command's own", KVEventsAuto, `vllm serve m --kv-events-config '{"enable_kv_cache_events":true,"endpoint":"tcp://*:6000","topic":"t"}'`, "",
			"tcp://127.0.0.1:6000", "t", false},
		{"auto: the command's own, unreadable", KVEventsAuto, `vllm serve m --kv-events-config '{"endpoint": "tcp://*:6000"}'`, "", "", "", true},
		{"auto: added", KVEventsAuto, "vllm serve m --port 8001", "", "port", "kv-events", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Config: httpengine.Config{Command: tc.cmd}, KVEvents: tc.kv, KVEventsTopic: tc.topic}
			got, err := kvEventsConfig(&cfg)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if tc.want == "port" {
				if !strings.HasPrefix(got, "tcp://127.0.0.1:") {
					t.Fatalf("endpoint %q", got)
				}
				var kc struct{ Endpoint, Topic string }
				if err := json.Unmarshal([]byte(httpengine.FlagValue(cfg.Command, "--kv-events-config")), &kc); err != nil ||
					kc.Endpoint != "tcp://*:"+strings.TrimPrefix(got, "tcp://127.0.0.1:") || kc.Topic != "kv-events" {
					t.Fatalf("command %q: --kv-events-config does not publish on %s (%v)", cfg.Command, got, err)
				}
			} else if got != tc.want {
				t.Errorf("endpoint %q, want %q", got, tc.want)
			}
			if cfg.KVEventsTopic != tc.wantTopic {
				t.Errorf("topic %q, want %q", cfg.KVEventsTopic, tc.wantTopic)
			}
		})
	}
}

func TestTokenizeBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind schemas.Kind
		body string
		want string // "": none
	}{
		{"chat", schemas.KindChat,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"tools":[{"type":"function"}],"temperature":1}`,
			`{"add_generation_prompt":false,"messages":[{"role":"user","content":"hi"}],"model":"m","tools":[{"type":"function"}]}`},
		{"completion", schemas.KindCompletion, `{"model":"m","prompt":"once upon a time","max_tokens":3}`,
			`{"model":"m","prompt":"once upon a time"}`},
		{"completion of token ids", schemas.KindCompletion, `{"model":"m","prompt":[1,2,3]}`, ""},
		{"completion of strings", schemas.KindCompletion, `{"model":"m","prompt":["a","b"]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := kvJob{kind: tc.kind, model: "m", body: []byte(tc.body)}
			got, ok := tokenizeBody(j, schemas.PromptSpan(j.body))
			if ok != (tc.want != "") || string(got) != tc.want {
				t.Errorf("got %s (%v), want %s", got, ok, tc.want)
			}
		})
	}
}
