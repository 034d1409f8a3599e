package fakevllm

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestKVTransfer: the fields of vLLM's KV-transfer handshake, for both
// phases and both paths.
func TestKVTransfer(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
	}{
		{"chat", "/v1/chat/completions", `{"model":"base","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`},
		{"completion", "/v1/completions", `{"model":"base","prompt":"hi","max_tokens":4,"stream":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New()
			ts := httptest.NewServer(f)
			defer ts.Close()

			pb, _ := schemas.PrefillBody([]byte(tc.body))
			resp, answer := post(t, ts.URL+tc.path, string(pb))
			params := schemas.TransferParamsOf(answer)
			if resp.StatusCode != 200 || params == nil {
				t.Fatalf("prefill: %d %s", resp.StatusCode, answer)
			}
			var p struct {
				DoRemotePrefill bool   `json:"do_remote_prefill"`
				DoRemoteDecode  bool   `json:"do_remote_decode"`
				BlockIDs        []int  `json:"remote_block_ids"`
				EngineID        string `json:"remote_engine_id"`
				RequestID       string `json:"remote_request_id"`
				Host            string `json:"remote_host"`
				Port            int    `json:"remote_port"`
				TPSize          int    `json:"tp_size"`
			}
			if err := json.Unmarshal(params, &p); err != nil {
				t.Fatal(err)
			}
			if !p.DoRemotePrefill || p.DoRemoteDecode || len(p.BlockIDs) != 1 || p.EngineID != f.EngineID || p.EngineID == "" ||
				p.RequestID == "" || "http://"+net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) != ts.URL || p.TPSize != 1 {
				t.Fatalf("params %s (server %s, engine %s)", params, ts.URL, f.EngineID)
			}
			if f.Prefills() != 1 || f.RemotePrefills() != 0 {
				t.Fatalf("prefills %d, remote prefills %d", f.Prefills(), f.RemotePrefills())
			}

			// The decode: recorded, streamed.
			params = append(params[:len(params)-1:len(params)-1], `,"x_unknown":[1]}`...)
			db, _ := schemas.DecodeBody([]byte(tc.body), params)
			resp, body := post(t, ts.URL+tc.path, string(db))
			if resp.StatusCode != 200 || !strings.Contains(string(body), " tok3") || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Fatalf("decode: %d %s", resp.StatusCode, body)
			}
			if f.RemotePrefills() != 1 || string(f.LastTransferParams()) != string(params) || len(f.TransferParams()) != 1 {
				t.Fatalf("recorded %d: %s", f.RemotePrefills(), f.LastTransferParams())
			}

			// Refused: a 503 kv_transfer_failed, before any event.
			f.SetRefuseTransfer(true)
			resp, body = post(t, ts.URL+tc.path, string(db))
			var e struct {
				Error schemas.ErrorBody `json:"error"`
			}
			json.Unmarshal(body, &e)
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || e.Error.Code == nil || *e.Error.Code != "kv_transfer_failed" ||
				!strings.Contains(e.Error.Message, f.EngineID) {
				t.Fatalf("refused decode: %d %s", resp.StatusCode, body)
			}
			if f.RemotePrefills() != 2 {
				t.Fatalf("recorded %d", f.RemotePrefills())
			}
			// A request without params is served as ever.
			if resp, body := post(t, ts.URL+tc.path, tc.body); resp.StatusCode != 200 || f.RemotePrefills() != 2 {
				t.Fatalf("plain request: %d %s", resp.StatusCode, body)
			}
		})
	}
	if New().EngineID == New().EngineID {
		t.Fatal("two fakes with one engine id")
	}
}
