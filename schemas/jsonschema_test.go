package schemas

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The JSON Schemas in jsonschema/ describe the bodies for clients in other
// languages; this test keeps them in step with the Go types.
func TestJSONSchemasMatchGoTypes(t *testing.T) {
	c := jsonschema.NewCompiler()
	files, _ := filepath.Glob("jsonschema/*.json")
	if len(files) == 0 {
		t.Fatal("no schema files")
	}
	ids := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		id := doc.(map[string]any)["$id"].(string)
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
		ids[strings.TrimSuffix(filepath.Base(f), ".json")] = id
	}
	usage := &Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, PromptTokensDetails: &TokenDetails{CachedTokens: 1}}
	tests := []struct {
		schema string
		value  any
	}{
		{"usage", usage},
		{"queued", Queued{Position: 2, Dispatcher: "d1", TimeoutMS: 60000}},
		{"kv_events", KVEvents{Worker: "w1", BlockBytes: 64, Seq: 3, Stored: [][]uint64{{1, 1 << 63}}, Removed: []uint64{7}, Dropped: 2}},
		{"kv_events", KVEvents{Worker: "w1", BlockBytes: 64, Seq: 4}},
		{"queued", Queued{Position: 2, Dispatcher: "d1", TimeoutMS: 60000, RequestID: "r1", CancelToken: NewCancelToken()}},
		{"queued", Queued{Position: 7, WaitMS: 1200, Band: "batch", TimeoutMS: 2000}},
		{"accepted", Accepted{RequestID: "r1", Worker: "w1", Cancel: CancelSubject("w1")}},
		{"accepted", Accepted{RequestID: "r1", Worker: "w1", Cancel: CancelSubject("w1"), CancelToken: NewCancelToken()}},
		{"done", DoneInfo{Usage: usage}},
		{"error", ErrQueueFull.New("m")},
		{"error", ErrMissingParam.At("messages", "messages")},
		{"heartbeat", Heartbeat{Worker: "w1", Models: []string{"m"}, MaxConcurrency: 8, Healthy: true, Engine: "sim", Version: "1", IntervalMS: 1000, Seq: 1}},
		{"heartbeat", Heartbeat{Worker: "w1", Models: []string{"m", "a"}, Adapters: []string{"a"}, Loading: []string{"b"}, MaxModelLen: map[string]int{"m": 8192},
			MaxConcurrency: 8, Healthy: true, Engine: "vllm", Version: "1", IntervalMS: 1000, Seq: 1}},
		{"done_notice", DoneNotice{Worker: "w1", RequestID: "r1", Running: 0}},
		{"done_notice", DoneNotice{Worker: "w1", RequestID: "r1", Running: 2, Failed: true, PromptTokens: 40, CompletionTokens: 3, PrefillMS: 2.5, HeldMS: 40}},
		{"adapter_request", AdapterRequest{Name: "a", Base: "b", Path: "/p"}},
		{"ctl_reply", CtlReply{OK: false, Error: ErrInternal.New("x")}},
		{"ctl_reply", CtlReply{OK: true}},
	}
	for _, tt := range tests {
		sch, err := c.Compile(ids[tt.schema])
		if err != nil {
			t.Fatalf("compile %s: %v", tt.schema, err)
		}
		b, _ := json.Marshal(tt.value)
		v, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s does not validate %s: %v", tt.schema, b, err)
		}
	}
	// And the schemas do reject what is wrong.
	sch, _ := c.Compile(ids["error"])
	bad, _ := jsonschema.UnmarshalJSON(strings.NewReader(`{"status":200,"error":{"message":"x"}}`))
	if sch.Validate(bad) == nil {
		t.Error("error schema accepted a 200 without type/param/code")
	}
	sch, _ = c.Compile(ids["heartbeat"])
	bad, _ = jsonschema.UnmarshalJSON(strings.NewReader(`{"worker":"w1","models":["m"],"max_concurrency":1,"running":0,"waiting":0,` +
		`"kv_cache_usage":0,"healthy":true,"engine":"sim","version":"1","interval_ms":250,"seq":1,"max_model_len":{"m":"8192"}}`))
	if sch.Validate(bad) == nil {
		t.Error("heartbeat schema accepted a max_model_len that is not an integer")
	}
}
