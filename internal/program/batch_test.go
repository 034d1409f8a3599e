package program

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/internal/testenv"
)

// batchAPI is a client of one gateway's Files and Batches APIs, for tests.
type batchAPI struct {
	t    *testing.T
	base string
}

func (a batchAPI) do(method, path, ctype string, body io.Reader, out any) int {
	a.t.Helper()
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(b, out); err != nil {
			if p, ok := out.(*[]byte); ok {
				*p = b
			} else {
				a.t.Fatalf("%s %s: %v: %s", method, path, err, b)
			}
		}
	} else if p, ok := out.(*[]byte); ok {
		*p = b
	}
	return resp.StatusCode
}

func (a batchAPI) upload(name string, content []byte) batch.File {
	a.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", name)
	_, _ = fw.Write(content)
	_ = mw.Close()
	var f batch.File
	if st := a.do("POST", "/v1/files", mw.FormDataContentType(), &buf, &f); st != 200 {
		a.t.Fatalf("upload: %d", st)
	}
	return f
}

func (a batchAPI) create(fileID, endpoint string) batch.Batch {
	a.t.Helper()
	var b batch.Batch
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"24h"}`, fileID, endpoint)
	if st := a.do("POST", "/v1/batches", "application/json", strings.NewReader(body), &b); st != 200 {
		a.t.Fatalf("create batch: %d", st)
	}
	return b
}

func (a batchAPI) wait(id string, until func(batch.Batch) bool) batch.Batch {
	a.t.Helper()
	var b batch.Batch
	testenv.WaitFor(a.t, 30*time.Second, func() error {
		b = batch.Batch{}
		if st := a.do("GET", "/v1/batches/"+id, "", nil, &b); st != 200 || !until(b) {
			return fmt.Errorf("batch %s: %d %s %+v", id, st, b.Status, b.RequestCounts)
		}
		return nil
	})
	return b
}

func chatLines(n int, model string) []byte {
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi %d"}]}}`+"\n", i, model, i)
	}
	return buf.Bytes()
}

// A batch through dev: upload, create, run, the output file in OpenAI's
// line format with every custom_id once.
func TestBatchRunsThroughDev(t *testing.T) {
	cfg := DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "", "127.0.0.1:-1"
	cfg.SimWorkers = 2
	fast(&cfg.Engine)
	d, err := StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	api := batchAPI{t: t, base: "http://" + d.Addr()}

	const n = 50
	f := api.upload("in.jsonl", chatLines(n, d.Models()[0]))
	if f.Object != "file" || f.Purpose != "batch" || f.Bytes != int64(len(chatLines(n, d.Models()[0]))) || f.Filename != "in.jsonl" {
		t.Fatalf("file %+v", f)
	}
	b := api.create(f.ID, "/v1/chat/completions")
	if b.Status != batch.StatusValidating || b.Object != "batch" || b.ExpiresAt == nil {
		t.Fatalf("created %+v", b)
	}
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCompleted || b.Status == batch.StatusFailed })
	if b.Status != batch.StatusCompleted || b.RequestCounts != (batch.RequestCounts{Total: n, Completed: n}) ||
		b.OutputFileID == nil || b.ErrorFileID != nil || b.CompletedAt == nil || b.InProgressAt == nil || b.FinalizingAt == nil {
		t.Fatalf("ended %+v errors %+v", b, b.Errors)
	}
	var out []byte
	if st := api.do("GET", "/v1/files/"+*b.OutputFileID+"/content", "", nil, &out); st != 200 {
		t.Fatalf("output content: %d %s", st, out)
	}
	seen := map[string]bool{}
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var ol struct {
			ID       string `json:"id"`
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int             `json:"status_code"`
				RequestID  string          `json:"request_id"`
				Body       json.RawMessage `json:"body"`
			} `json:"response"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(line, &ol); err != nil {
			t.Fatalf("output line %s: %v", line, err)
		}
		if seen[ol.CustomID] || !strings.HasPrefix(ol.ID, "batch_req_") || ol.Response.StatusCode != 200 ||
			string(ol.Error) != "null" || !bytes.Contains(ol.Response.Body, []byte(`"chat.completion"`)) {
			t.Fatalf("output line %s", line)
		}
		seen[ol.CustomID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d custom_ids in the output, want %d", len(seen), n)
	}
}
