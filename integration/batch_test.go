package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// batchState is what the crash test reads of a batch.
type batchState struct {
	ID            string  `json:"id"`
	Status        string  `json:"status"`
	OutputFileID  *string `json:"output_file_id"`
	ErrorFileID   *string `json:"error_file_id"`
	RequestCounts struct {
		Total, Completed, Failed int
	} `json:"request_counts"`
}

// httpJSON sends one request (hdr: name, value pairs) and reads a 200's
// JSON body into out.
func httpJSON(method, url, ctype string, body io.Reader, out any, hdr ...string) (int, []byte, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return 0, nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && out != nil && resp.StatusCode == 200 {
		err = json.Unmarshal(b, out)
	}
	return resp.StatusCode, b, err
}

// kill9 kills p at once, as a crash would, and waits for it to be gone.
func (p *proc) kill9(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	err := <-p.done
	p.done <- err
}

// TestBatchSurvivesCrashes is issue 16's crash test: a batch of 300 lines
// against sim workers, separate processes on a standalone nats-server with
// file storage; mid-batch, kill -9 the gateway (its runner with lines in
// flight), then a worker, then the NATS server itself, restarting each.
// The batch completes and every custom_id is in the output exactly once.
func TestBatchSurvivesCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and kill -9, ~30 s")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	natsPort, httpPort := testenv.FreePort(t), testenv.FreePort(t)
	storeDir := t.TempDir()
	natsArgs := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", storeDir}
	natsProc := startProc(t, "nats-server", natsServer(t), natsArgs...)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	common := []string{"--nats-url", natsURL, "--redis-url", ""}
	// 20 ms a decode step: slow enough that the polls below see the batch
	// between kills (at 5 ms, with no bounced requests slowing it, the last
	// 100 lines ran between two polls on a busy machine).
	worker := func(id string) *proc {
		return startProc(t, id, bin, append([]string{"worker", "--id", id, "--sim-decode-base", "20ms", "--drain-timeout", "1s"}, common...)...)
	}
	w1 := worker("w1")
	w2 := worker("w2")
	gwArgs := append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--auth=false", "--admin", "",
		"--batch-max-in-flight", "8", "--batch-ack-wait", "2s"}, common...)
	gw := startProc(t, "gateway", bin, gwArgs...)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitReady(t, base)

	const n = 300
	var in bytes.Buffer
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"llama-8b","max_tokens":16,"ignore_eos":true,"messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, i)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "crash.jsonl")
	_, _ = fw.Write(in.Bytes())
	_ = mw.Close()
	var file struct{ ID string }
	if st, b, err := httpJSON("POST", base+"/v1/files", mw.FormDataContentType(), &body, &file); st != 200 || err != nil {
		t.Fatalf("upload: %d %v %s", st, err, b)
	}
	var b batchState
	if st, raw, err := httpJSON("POST", base+"/v1/batches", "application/json", strings.NewReader(
		`{"input_file_id":"`+file.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`), &b); st != 200 || err != nil {
		t.Fatalf("create: %d %v %s", st, err, raw)
	}
	// done polls the batch (through whichever gateway is up) until cond.
	done := func(what string, cond func(batchState) bool) {
		t.Helper()
		testenv.WaitFor(t, 90*time.Second, func() error {
			var s batchState
			st, raw, err := httpJSON("GET", base+"/v1/batches/"+b.ID, "", nil, &s)
			if err != nil || st != 200 {
				return fmt.Errorf("%s: %d %v %s", what, st, err, raw)
			}
			b = s
			if !cond(s) {
				return fmt.Errorf("%s: %s %+v", what, s.Status, s.RequestCounts)
			}
			return nil
		})
	}
	// answered waits for k answered lines, and fails if the batch has ended
	// already: a kill after the end would test nothing.
	answered := func(k int) func(batchState) bool {
		return func(s batchState) bool {
			if s.Status != "in_progress" && s.Status != "validating" {
				t.Fatalf("the batch is %s before the kill at %d lines: nothing would be tested", s.Status, k)
			}
			return s.RequestCounts.Completed+s.RequestCounts.Failed >= k
		}
	}

	done("30 lines", answered(30))
	t.Logf("kill -9 the gateway at %+v", b.RequestCounts)
	gw.kill9(t)
	gw = startProc(t, "gateway-2", bin, gwArgs...)
	waitReady(t, base)

	done("120 lines", answered(120))
	t.Logf("kill -9 worker w1 at %+v", b.RequestCounts)
	w1.kill9(t)
	w1 = worker("w1-2")

	done("200 lines", answered(200))
	t.Logf("kill -9 the NATS server at %+v", b.RequestCounts)
	natsProc.kill9(t)
	natsProc = startProc(t, "nats-server-2", natsServer(t), natsArgs...)
	// The programs first, while NATS is there for them to drain on (the
	// cleanups would stop NATS first: the last started).
	defer func() {
		for _, p := range []*proc{gw, w1, w2, natsProc} {
			_ = p.stop(t, 10*time.Second)
		}
	}()

	done("the end", func(s batchState) bool { return s.Status == "completed" || s.Status == "failed" })
	if b.Status != "completed" || b.RequestCounts.Total != n || b.RequestCounts.Completed != n || b.OutputFileID == nil {
		t.Fatalf("batch ended %s %+v (error file %v)", b.Status, b.RequestCounts, b.ErrorFileID)
	}
	st, out, err := httpJSON("GET", base+"/v1/files/"+*b.OutputFileID+"/content", "", nil, nil)
	if st != 200 || err != nil {
		t.Fatalf("output: %d %v", st, err)
	}
	count := map[string]int{}
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var ol struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					Usage struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				} `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal(line, &ol); err != nil || ol.Response.StatusCode != 200 || ol.Response.Body.Usage.CompletionTokens != 16 {
			t.Fatalf("output line %s: %v", line, err)
		}
		count[ol.CustomID]++
	}
	for i := range n {
		if c := count[fmt.Sprintf("c-%d", i)]; c != 1 {
			t.Errorf("custom_id c-%d is in the output %d times, want once", i, c)
		}
	}
	if len(count) != n {
		t.Errorf("%d custom_ids in the output, want %d", len(count), n)
	}
}
