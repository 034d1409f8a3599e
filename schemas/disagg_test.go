package schemas

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestPrefillBody(t *testing.T) {
	tests := []struct {
		name, body string
		want       map[string]any
	}{
		{"chat stream with options", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":50,"x_extra":{"a":1}}`,
			map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "stream": false,
				"max_tokens": 1.0, "max_completion_tokens": 1.0, "x_extra": map[string]any{"a": 1.0},
				"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
					"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}},
		{"completion, old params replaced", `{"model":"m","prompt":"p","max_tokens":9,"kv_transfer_params":{"do_remote_prefill":true}}`,
			map[string]any{"model": "m", "prompt": "p", "stream": false, "max_tokens": 1.0,
				"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
					"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, ok := PrefillBody([]byte(tc.body))
			if !ok {
				t.Fatal("not rewritten")
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %s", b)
			}
			if _, err := ReadRequest(KindChat, b, ""); err != nil && tc.name[0] == 'c' && tc.name[1] == 'h' {
				t.Fatalf("prefill body unreadable: %v", err)
			}
		})
	}
	if _, ok := PrefillBody([]byte(`[1]`)); ok {
		t.Fatal("an array was rewritten")
	}
}

func TestDecodeBodyAndParams(t *testing.T) {
	resp := []byte(`{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e1","remote_block_ids":[1,2],"remote_host":"10.0.0.1","remote_port":5600,"tp_size":1,"future_field":{"k":[1]}}}`)
	p := TransferParamsOf(resp)
	if p == nil || TransferParamString(p, "remote_engine_id") != "e1" || TransferParamString(p, "remote_port") != "5600" {
		t.Fatalf("params %s", p)
	}
	body := []byte(`{"model":"m","kv_transfer_params":null,"messages":[{"role":"user","content":"hi"}],"stream":true}`)
	d, ok := DecodeBody(body, p)
	if !ok {
		t.Fatal("not rewritten")
	}
	r, err := ReadRequest(KindChat, d, "")
	if err != nil {
		t.Fatal(err)
	}
	if string(r.KVTransfer) != string(p) || !r.Stream {
		t.Fatalf("decode body %s", d)
	}
	plain, ok := WithoutTransferParams(d)
	if r2, err := ReadRequest(KindChat, plain, ""); !ok || err != nil || r2.KVTransfer != nil {
		t.Fatalf("without params: %s %v", plain, err)
	}
	for _, none := range []string{`{"id":"x"}`, `{"kv_transfer_params":null}`, `not json`} {
		if TransferParamsOf([]byte(none)) != nil {
			t.Fatalf("params found in %s", none)
		}
	}
	if _, err := ReadRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":3}`), ""); err == nil {
		t.Fatal("a number taken as kv_transfer_params")
	}
}
