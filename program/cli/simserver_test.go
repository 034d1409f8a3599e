package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/program"
)

func TestExpandNargs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"--lora-modules a=/x b=/y --max-loras 3", "--lora-modules a=/x --lora-modules b=/y --max-loras 3"},
		{"--lora-modules a=/x", "--lora-modules a=/x"},
		{"--lora-modules=a=/x b", "--lora-modules=a=/x b"},
		{"--port 1 --lora-modules a=/x -- b=/y", "--port 1 --lora-modules a=/x -- b=/y"},
		{"--lora-modules", "--lora-modules"},
	} {
		if got := strings.Join(expandNargs(strings.Fields(tc.in), "--lora-modules"), " "); got != tc.want {
			t.Errorf("expandNargs(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// startSimServer starts sim-server as its flags args configure it and
// returns its URL and a stop function that reports the program's error.
func startSimServer(t *testing.T, args ...string) (string, func() error) {
	t.Helper()
	cfg, _, err := simServerConfig(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := program.StartSimServer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + srv.Addr(), srv.Close
}

func call(t *testing.T, method, url, body string, headers ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestSimServer(t *testing.T) {
	t.Setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "")
	t.Setenv("VLLM_API_KEY", "")
	url, stop := startSimServer(t, "--host", "127.0.0.1", "--port", "0",
		"--model", "/models/llama", "--served-model-name", "m1,m2",
		"--lora-modules", "a=/adapters/a", `{"name":"b","path":"/adapters/b"}`, "--max-loras", "3", "--max-model-len", "4096",
		"--api-key", "k", "--allow-runtime-lora", "--legacy-errors", "--gpu-cache-metric",
		"--sim-decode-base", "1ms", "--sim-prefill-base", "1ms", "--sim-lora-load-time", "0s")
	auth := []string{"Authorization", "Bearer k"}

	status, body := call(t, "GET", url+"/v1/models", "", auth...)
	var list struct {
		Data []struct {
			ID, Root    string
			Parent      *string
			MaxModelLen *int `json:"max_model_len"`
		}
	}
	if err := json.Unmarshal([]byte(body), &list); status != 200 || err != nil {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, []string{"m1", "m2", "a", "b"}) || list.Data[0].Root != "/models/llama" || *list.Data[0].MaxModelLen != 4096 ||
		list.Data[2].Root != "/adapters/a" || *list.Data[2].Parent != "m1" {
		t.Errorf("/v1/models: %s", body)
	}

	if status, _ := call(t, "GET", url+"/v1/models", ""); status != 401 {
		t.Errorf("no key: %d", status)
	}
	status, body = call(t, "POST", url+"/v1/completions", `{"model":"m2","prompt":"hi","max_tokens":5000}`, auth...)
	if status != 400 || !strings.Contains(body, `"object":"error"`) || !strings.Contains(body, "maximum context length is 4096") {
		t.Errorf("--legacy-errors, --max-model-len: %d %s", status, body)
	}
	status, body = call(t, "POST", url+"/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`, auth...)
	if status != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") || !strings.Contains(body, `"model":"a"`) {
		t.Errorf("stream on adapter a: %d %s", status, body)
	}
	if status, body = call(t, "POST", url+"/v1/load_lora_adapter", `{"lora_name":"c","lora_path":"/c"}`, auth...); status != 200 {
		t.Errorf("--allow-runtime-lora: %d %s", status, body)
	}
	status, body = call(t, "GET", url+"/metrics", "")
	for _, want := range []string{`vllm:lora_requests_info{max_lora="3"`, `vllm:gpu_cache_usage_perc{engine="0",model_name="m1"}`,
		`vllm:generation_tokens_total{engine="0",model_name="m1"} 3`} {
		if status != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestSimServerRuntimeLoRAEnv: as vLLM, the LoRA routes exist only with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (or the flag).
func TestSimServerRuntimeLoRAEnv(t *testing.T) {
	for _, env := range []string{"", "False", "True", "1"} {
		t.Run("env="+env, func(t *testing.T) {
			t.Setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", env)
			url, _ := startSimServer(t, "--listen", "127.0.0.1:0")
			status, body := call(t, "POST", url+"/v1/load_lora_adapter", `{"lora_name":"c","lora_path":"/c"}`)
			want := 404
			if env == "True" || env == "1" {
				want = 200
			}
			if status != want {
				t.Errorf("load: %d %s, want %d", status, body, want)
			}
		})
	}
}

func TestSimServerBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--lora-modules", "no-path"},
		{"--lora-modules", "{bad json"},
		{"--listen", "nowhere", "--port", "1"},
		{"--max-loras", "1", "--lora-modules", "a=/a", "b=/b"},
	} {
		err := Run(context.Background(), append([]string{"sim-server", "--listen", "127.0.0.1:0", "--log-level", "error"}, args...), io.Discard, io.Discard)
		if err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestSimServerKVTransfer: the flags and vLLM's settings of the KV-transfer
// handshake (prefill/decode disaggregation).
func TestSimServerKVTransfer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       map[string]string
		args      []string
		addr      string
		hold      time.Duration
		base, per time.Duration
		bad       bool
	}{
		{name: "defaults", addr: "127.0.0.1:0", hold: 30 * time.Second, base: time.Millisecond, per: 500 * time.Nanosecond},
		{name: "flags", args: []string{"--sim-kv-hold", "5s", "--sim-kv-transfer-base", "2ms", "--sim-kv-transfer-per-token", "2.6us",
			"--sim-kv-transfer-addr", "127.0.0.1:7001"}, addr: "127.0.0.1:7001", hold: 5 * time.Second, base: 2 * time.Millisecond, per: 2600 * time.Nanosecond},
		{name: "vLLM's side channel", env: map[string]string{"VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"}, addr: "127.0.0.1:5601"},
		{name: "vLLM's side channel host", env: map[string]string{"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.2"}, addr: "10.0.0.2:5600"},
		{name: "the flag wins", env: map[string]string{"VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"}, args: []string{"--sim-kv-transfer-addr", "127.0.0.1:7002"}, addr: "127.0.0.1:7002"},
		{name: "kv-transfer-config", args: []string{"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`}, addr: "127.0.0.1:0"},
		{name: "bad kv-transfer-config", args: []string{"--kv-transfer-config", `NixlConnector`}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"} {
				t.Setenv(k, tc.env[k])
			}
			cfg, _, err := simServerConfig(tc.args, io.Discard)
			if tc.bad {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := cfg.Sim
			if s.KVTransferAddr != tc.addr || (tc.hold != 0 && (s.KVHoldTime != tc.hold || s.KVTransferBase != tc.base || s.KVTransferPerToken != tc.per)) {
				t.Fatalf("config %v %v %v %v", s.KVTransferAddr, s.KVHoldTime, s.KVTransferBase, s.KVTransferPerToken)
			}
		})
	}
}
